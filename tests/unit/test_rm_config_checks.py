"""rm.toml and cluster.toml values the RM cannot run with stop it at start with the key named
(`elastane`'s daemons exit 2 on a ConfigError), rather than starting an RM that refuses every
submission, never expires a node or issues tokens that are already expired."""
from __future__ import annotations

import pytest

from protocol import config as config_mod
from rm.__main__ import load_configs, parse_args

GOOD_CLUSTER = '[cluster]\nsecret = "s"\n'


def _load(tmp_path, rm_text: str, cluster_text: str = GOOD_CLUSTER):
    (tmp_path / "rm.toml").write_text(rm_text)
    (tmp_path / "cluster.toml").write_text(cluster_text)
    return load_configs(parse_args(["--config", str(tmp_path / "rm.toml"),
                                    "--cluster-config", str(tmp_path / "cluster.toml")]))


@pytest.mark.parametrize("text,needle", [
    ("[rm]\nnm_expiry_s = nan\n", "nm_expiry_s must be a positive number of seconds, got nan"),
    ("[rm]\nam_expiry_s = 0.0\n", "am_expiry_s must be a positive number of seconds"),
    ("[rm]\nam_expiry_s = inf\n", "am_expiry_s must be a positive number of seconds"),
    ("[rm]\ncontainer_token_lifetime_s = -1.0\n", "container_token_lifetime_s must be a positive number"),
    ("[rm]\nmax_app_attempts = 0\n", "max_app_attempts must be >= 1, got 0"),
    ("[rm]\nmaximum_allocation_vcores = 0\n", "maximum_allocation_vcores must be >= 1"),
    ("[rm]\nnm_heartbeat_interval_ms = 0\n", "nm_heartbeat_interval_ms must be >= 1"),
    ('[[queues]]\nname = "q"\ndefault_app_lifetime_s = 4000000000\n',
     "queue 'q': default_app_lifetime_s must be at most 3153600000"),
    # a setting above every [section] is read by no one: said, not dropped
    ("nm_expiry_s = 4.0\n[rm]\n", "nm_expiry_s outside any [section]"),
    # nor is a misspelt table: every queue but "default" was gone, silently
    ('[[queue]]\nname = "prod"\ncapacity = 100.0\n', "[queue]; this file's tables are [ha], [queues], [rm]"),
])
def test_a_value_the_rm_cannot_run_with_is_a_config_error_naming_it(tmp_path, text, needle) -> None:
    with pytest.raises(config_mod.ConfigError, match=needle.replace("[", r"\[")):
        _load(tmp_path, text)


def test_an_am_token_lifetime_that_expires_every_token_is_refused(tmp_path) -> None:
    with pytest.raises(config_mod.ConfigError, match=r"\[cluster\] token_lifetime_s must be a positive number"):
        _load(tmp_path, "[rm]\n", '[cluster]\nsecret = "s"\ntoken_lifetime_s = -5.0\n')


def test_the_shipped_settings_and_good_overrides_load(tmp_path) -> None:
    rm_cfg, cluster = _load(tmp_path, "[rm]\nnm_expiry_s = 4.5\nmax_app_attempts = 1\n")
    assert (rm_cfg.nm_expiry_s, rm_cfg.max_app_attempts, cluster.secret) == (4.5, 1, "s")
    rm_cfg, _ = _load(tmp_path, (config_mod.CONF_DIR / "rm.toml").read_text())
    assert rm_cfg.queues


def test_a_second_rm_on_the_same_state_dir_is_refused_before_it_recovers_anything(tmp_path) -> None:
    """The lock is per state_dir and held for the process's life: a second RM there (a
    --foreground start beside the daemon) stops naming the holder, and the dir is free again once
    the first is gone."""
    import os  # noqa: PLC0415

    from rm.__main__ import lock_state_dir  # noqa: PLC0415

    first = lock_state_dir(str(tmp_path / "state"))
    try:
        with pytest.raises(config_mod.ConfigError, match=rf"in use by another ResourceManager \(pid {os.getpid()}\)"):
            lock_state_dir(str(tmp_path / "state"))
    finally:
        os.close(first)
    os.close(lock_state_dir(str(tmp_path / "state")))


def test_an_rm_whose_port_is_taken_or_state_dir_is_held_exits_2_saying_why(tmp_path, capsys, monkeypatch) -> None:
    import gc  # noqa: PLC0415
    import os  # noqa: PLC0415
    import socket  # noqa: PLC0415

    from rm.__main__ import lock_state_dir, main  # noqa: PLC0415

    # main() run in-process: the test session keeps its loop policy and its GC thresholds.
    monkeypatch.setattr("protocol.daemon.install_uvloop", lambda: None)
    monkeypatch.setattr(gc, "set_threshold", lambda *a: None)

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    (tmp_path / "rm.toml").write_text(f'[rm]\nhost = "127.0.0.1"\nport = {port}\nstate_dir = "{tmp_path / "state"}"\n')
    (tmp_path / "cluster.toml").write_text(GOOD_CLUSTER)
    args = ["--config", str(tmp_path / "rm.toml"), "--cluster-config", str(tmp_path / "cluster.toml")]
    try:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "rm: cannot start" in err and str(port) in err
    finally:
        taken.close()
    held = lock_state_dir(str(tmp_path / "state"))
    try:
        assert main(args) == 2
        assert "in use by another ResourceManager" in capsys.readouterr().err
    finally:
        os.close(held)


@pytest.mark.parametrize("table", ["HA", "storag", "clusters"])
def test_a_misspelt_table_in_cluster_toml_is_refused_naming_it(tmp_path, table: str) -> None:
    """[HA] for [ha] started one RM without HA, [storag] ran on an empty storage config."""
    from protocol.ha_config import load_ha  # noqa: PLC0415

    (tmp_path / "cluster.toml").write_text(f'[cluster]\nsecret = "s"\n[{table}]\nenabled = true\n')
    for loader in (config_mod.load_cluster, config_mod.load_storage, load_ha):
        with pytest.raises(config_mod.ConfigError, match=rf"unknown table\(s\) \[{table}\]"):
            loader(str(tmp_path / "cluster.toml"))
