"""How Elastane processes learn the object store's endpoint and credentials (docs/operating.md,
"Object storage (S3)"): cluster.toml's [storage] becomes the standard AWS variables where the
environment does not set them, bad settings are refused naming the key, and an NM passes the
variables of its own environment into every container it starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from nodemanager.launcher import LaunchSpec, build_env
from protocol import config, storage_settings
from protocol.internal_api import LaunchContext

STORAGE = """[cluster]
secret = "s"

[storage]
s3_endpoint_url = "http://seaweed1:8333"
s3_region = "eu-west-1"
s3_access_key_id = "AKIDCLUSTER"
s3_secret_access_key = "cluster-secret"
"""


def _conf(tmp_path: Path, text: str) -> str:
    p = tmp_path / "cluster.toml"
    p.write_text(text)
    return str(p)


def test_the_storage_table_becomes_the_aws_environment(tmp_path: Path) -> None:
    cfg = config.load_storage(_conf(tmp_path, STORAGE))
    env: dict[str, str] = {"PATH": "/bin"}
    assert sorted(storage_settings.apply(cfg, env)) == ["AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION",
                                                       "AWS_ENDPOINT_URL_S3", "AWS_SECRET_ACCESS_KEY"]
    assert env == {"PATH": "/bin", "AWS_ENDPOINT_URL_S3": "http://seaweed1:8333", "AWS_DEFAULT_REGION": "eu-west-1",
                   "AWS_ACCESS_KEY_ID": "AKIDCLUSTER", "AWS_SECRET_ACCESS_KEY": "cluster-secret"}
    # [cluster] is unaffected by the new table, and a conf without [storage] sets nothing
    assert config.load_cluster(_conf(tmp_path, STORAGE)).secret == "s"
    assert storage_settings.apply(config.load_storage(_conf(tmp_path, "[cluster]\n")), env := {}) == [] and env == {}


def test_the_environment_wins_and_credentials_go_as_a_pair(tmp_path: Path) -> None:
    cfg = config.load_storage(_conf(tmp_path, STORAGE))
    env = {"AWS_ENDPOINT_URL_S3": "http://other:9000", "AWS_ACCESS_KEY_ID": "AKIDMINE"}
    set_now = storage_settings.apply(cfg, env)
    assert sorted(set_now) == ["AWS_DEFAULT_REGION"]
    # the operator's own key id is not paired with the cluster's secret
    assert env == {"AWS_ENDPOINT_URL_S3": "http://other:9000", "AWS_ACCESS_KEY_ID": "AKIDMINE",
                   "AWS_DEFAULT_REGION": "eu-west-1"}


@pytest.mark.parametrize("body,needle", [
    ('s3_endpoint_url = "seaweed1:8333"', "s3_endpoint_url must be an http:// or https:// URL"),
    ('s3_endpoint_url = "http://"', "s3_endpoint_url must be an http:// or https:// URL"),
    ('s3_access_key_id = "AKID"', "s3_access_key_id and s3_secret_access_key go together"),
    ('s3_bucket = "x"', "s3_bucket"),
])
def test_bad_storage_settings_are_refused_naming_the_key(tmp_path: Path, body: str, needle: str) -> None:
    with pytest.raises(config.ConfigError, match="storage") as e:
        config.load_storage(_conf(tmp_path, f"[storage]\n{body}\n"))
    assert needle in str(e.value)


def test_an_nm_passes_the_object_store_settings_into_every_container(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(storage_settings.FORWARDED):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDNM")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nm-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://seaweed1:8333")
    monkeypatch.setenv("FSSPEC_S3_USE_SSL", "false")
    monkeypatch.setenv("ELASTANE_TEST_UNRELATED", "x")
    spec = LaunchSpec(container_id="container_1_0001_01_000001", app_id="application_1_0001",
                      attempt_id="appattempt_1_0001_000001", user="alice", memory_mb=128, vcores=1,
                      work_dir="/w", log_dir="/l", exit_file="/l/exit", nm_host="127.0.0.1", nm_port=1)
    env = build_env(spec, LaunchContext(commands=["true"]))
    assert env["AWS_ACCESS_KEY_ID"] == "AKIDNM" and env["AWS_SECRET_ACCESS_KEY"] == "nm-secret"
    assert env["AWS_ENDPOINT_URL_S3"] == "http://seaweed1:8333" and env["FSSPEC_S3_USE_SSL"] == "false"
    assert "ELASTANE_TEST_UNRELATED" not in env        # only the storage variables, not the NM's whole env
    # a job's own launch environment wins for its container
    own = build_env(spec, LaunchContext(commands=["true"], environment={"AWS_ACCESS_KEY_ID": "AKIDJOB"}))
    assert own["AWS_ACCESS_KEY_ID"] == "AKIDJOB"


def test_a_client_that_cannot_reach_the_store_still_validates_an_s3_init_from(tmp_path: Path, monkeypatch) -> None:
    """No credentials here and the endpoint down: the spec is valid (the AM reads init_from where
    it runs), and the RM's storage check -- what a submission runs -- names the field and URL."""
    from protocol import ps_job_spec

    pytest.importorskip("s3fs", reason="s3fs (the s3 extra) is not installed")
    for k in list(storage_settings.FORWARDED):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))                 # no ~/.aws
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")   # no instance-metadata credentials either
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    import s3_server
    s3_server.forget_cached_filesystems()
    try:
        spec = ps_job_spec.validate({"app": "mlr", "workers": 1, "servers": 1, "init_from": "s3://models/m1"})
        with pytest.raises(ps_job_spec.JobSpecError, match="'s3://models/m1': cannot reach the object store") as e:
            ps_job_spec.check_storage(spec)
        assert e.value.field == "init_from"
    finally:
        s3_server.forget_cached_filesystems()

