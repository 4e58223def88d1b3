"""cluster.toml's client_auth is "simple" or "token", nothing else: a misspelt value ("Token") is a
ConfigError naming the key and the allowed values in every loader (RM, NM, CLI: all read it with
load_cluster), never a silent fallback to simple auth that serves every app's logs to anyone."""
from __future__ import annotations

import msgspec
import pytest

from protocol import config as config_mod
from protocol.client_auth import check_log_reader, client_user
from protocol.remote_exception import Forbidden, Unauthorized
from rm.__main__ import load_configs, parse_args

ALLOWED = "client_auth must be one of 'simple', 'token'"


@pytest.mark.parametrize("value", ["Token", "tokens", "", "none"])
def test_a_client_auth_other_than_simple_or_token_is_a_config_error(tmp_path, value: str) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(f'[cluster]\nsecret = "s"\nclient_auth = "{value}"\nclient_tokens = {{"t-alice" = "alice"}}\n')
    with pytest.raises(config_mod.ConfigError, match=r"\$\.client_auth.*" + ALLOWED):
        config_mod.load_cluster(str(path))        # what the NM, the CLI and the RM read it with
    (tmp_path / "rm.toml").write_text("[rm]\n")
    with pytest.raises(config_mod.ConfigError, match=ALLOWED):
        load_configs(parse_args(["--config", str(tmp_path / "rm.toml"), "--cluster-config", str(path)]))


def test_both_modes_load(tmp_path) -> None:
    path = tmp_path / "cluster.toml"
    for value in ("simple", "token"):
        path.write_text(f'[cluster]\nsecret = "s"\nclient_auth = "{value}"\n')
        assert config_mod.load_cluster(str(path)).client_auth == value
    assert config_mod.ClusterConfig().client_auth == "simple"


def test_a_bad_client_auth_set_in_code_is_refused_too() -> None:
    with pytest.raises(ValueError, match=ALLOWED):
        config_mod.ClusterConfig(client_auth="Token")   # type: ignore[arg-type]
    with pytest.raises(ValueError, match=ALLOWED):
        msgspec.structs.replace(config_mod.ClusterConfig(), client_auth="Token")


def test_client_auth_checks_fail_closed_on_an_unknown_mode() -> None:
    cluster = config_mod.ClusterConfig(client_auth="token", client_tokens={"t-alice": "alice"})
    cluster.client_auth = "Token"     # type: ignore[assignment]  # (attribute assignment is not validated)
    with pytest.raises(Unauthorized):
        client_user(cluster, None, "root")            # ?user.name= is not taken at face value
    with pytest.raises(Forbidden):
        check_log_reader(cluster, "mallory", "alice", "container_x")
    assert client_user(cluster, "Bearer t-alice", "root") == "alice"
