"""The project's storage code paths on a real S3 server (SeaweedFS on loopback, tests/support/
s3_server.py), configured only by the standard AWS variables in the environment as a cluster's
processes are: durable dirs and the AM's checkpoints (attempt 2 on another "host" resumes from
attempt 1's latest), datasets (`data.path`), the client's staging area and the NM's localizer --
and a missing bucket or wrong keys are errors naming the URL, at submission where possible (the
RM's 400, the CLI's exit 2)."""
from __future__ import annotations

import io
import os
import posixpath
import tarfile
from pathlib import Path

import numpy as np
import pytest

import s3_server as s3mod
from appmaster.ps.checkpoints import JOB_MANIFEST, Checkpointer
from elastane_cli.errors import EXIT_USAGE, UsageError
from elastane_cli.staging import ShippedFiles
from nodemanager import localizer
from protocol import durable_storage, ps_job_spec
from protocol.dataset_manifest import DatasetError, load_manifest
from protocol.durable_storage import DurableDir, DurableStorageError
from protocol.local_resources import LocalResource
from protocol.checkpoint_manifest import JobRecord
from protocol.ps_job_spec import JobSpecError
from protocol.ps_status import EpochResult
from psruntime.apps.dataset_files import DatasetFileError, write_generated
from psruntime.apps.registry import create_app
from store_cluster import executor_cluster, pull_values, put_values, server_record
from test_rm_api import BASE, close_env, make_env, submission

pytestmark = pytest.mark.skipif(s3mod.unavailable_reason() is not None,
                                reason=f"no S3 server here: {s3mod.unavailable_reason()}")

NB = 8
SMALL_MLR = {"num_samples": 600, "num_heldout": 130, "rows_per_block": 100}


def _upload_tree(s3: s3mod.S3Bucket, local: Path, prefix: str) -> str:
    """Copy a local directory to s3://<bucket>/<prefix> with a client of its own; the URL."""
    fs = s3.filesystem()
    for p in sorted(local.rglob("*")):
        if p.is_file():
            fs.put_file(str(p), f"{s3.bucket}/{prefix}/{p.relative_to(local).as_posix()}")
    return s3.url(prefix)


# ----- durable dirs and checkpoints ----------------------------------------------------------------

def test_a_durable_dir_on_s3_keeps_what_it_wrote_for_another_client(s3, tmp_path: Path) -> None:
    d = DurableDir(s3.url("apps", "app_1"))
    assert d.local is None and d.entries() == ([], [])
    d.makedirs()
    d.write_bytes("status.json", b'{"ok": true}')
    (tmp_path / "a.buf").write_bytes(b"A" * 1000)
    (tmp_path / "b.buf").write_bytes(b"B" * 10)
    d.child("epoch-1").put_files([tmp_path / "a.buf", tmp_path / "b.buf"])
    assert d.entries() == (["epoch-1"], ["status.json"])
    # another client (its own connection and cache) sees the objects under the URL's keys
    other = s3.filesystem()
    assert other.cat_file(f"{s3.bucket}/apps/app_1/status.json") == b'{"ok": true}'
    assert other.info(f"{s3.bucket}/apps/app_1/epoch-1/a.buf")["size"] == 1000
    out = tmp_path / "back"
    out.mkdir()
    d.child("epoch-1").get_files(["a.buf", "b.buf"], out)
    assert (out / "a.buf").read_bytes() == b"A" * 1000 and (out / "b.buf").read_bytes() == b"B" * 10
    with pytest.raises(FileNotFoundError):
        d.read_bytes("missing.json")


def _job(epoch: int) -> JobRecord:
    spec = ps_job_spec.validate({"app": "mlr", "workers": 1, "servers": 2})
    history = [EpochResult(epoch=e, objective=1.0 / (e + 1), epoch_time_s=0.5, time=1000.0 + e) for e in range(epoch)]
    return JobRecord(spec=spec, attempt_id="appattempt_1_0001_000001", initial_objective=2.0,
                     objective_history=history, iterations=10 * epoch, clocks=2 * epoch, minibatches_run=40 * epoch)


async def test_checkpoints_on_s3_resume_on_another_host_from_the_latest(s3, tmp_path: Path) -> None:
    durable = DurableDir(s3.url("apps", "application_1_0001")).child("checkpoints")
    async with executor_cluster(2, NB) as (executors, ctl, dp):      # attempt 1, host A
        recs = [server_record(e, i) for i, e in enumerate(executors)]
        first = Checkpointer(durable, dp, staging=tmp_path / "host-a")
        await put_values(ctl, {k: np.arange(4, dtype=np.float32) + k for k in range(64)})
        await first.write(1, ctl.table, recs, _job(1))
        model = {k: np.arange(4, dtype=np.float32) * 2 + k for k in range(64)}
        await put_values(ctl, model)
        info = await first.write(2, ctl.table, recs, _job(2), clock=3)
        assert info.url == s3.url("apps", "application_1_0001", "checkpoints", "epoch-2-clock-3")
    # what is in the bucket: every block file of both checkpoints, each committed by its job.json
    keys = {k.split("/checkpoints/", 1)[1] for k in s3.filesystem().find(f"{s3.bucket}/apps")}
    for name in ("epoch-1", "epoch-2-clock-3"):
        assert f"{name}/{JOB_MANIFEST}" in keys
        assert sum(k.startswith(f"{name}/block_") for k in keys) == NB, sorted(keys)

    async with executor_cluster(3, NB) as (executors, ctl, dp):      # attempt 2, host B: own disk
        recs = [server_record(e, i) for i, e in enumerate(executors)]
        second = Checkpointer(durable, dp, staging=tmp_path / "host-b")
        latest = second.latest()
        assert latest is not None and (latest.record.epoch, latest.record.clock) == (2, 3)
        fetched = await second.fetch(latest)
        assert Path(fetched.dir).parent == tmp_path / "host-b"
        await second.restore(fetched.dir, recs, NB)
        got = await pull_values(ctl, list(model))
        for k, v in model.items():
            np.testing.assert_array_equal(got[k], v)


# ----- clean errors ----------------------------------------------------------------------------------

def test_a_missing_bucket_or_wrong_keys_are_errors_naming_the_url(s3, monkeypatch: pytest.MonkeyPatch) -> None:
    durable_storage.check_reachable(s3.url("checkpoints"))      # a prefix need not exist yet
    missing = "s3://no-such-bucket-here/checkpoints"
    with pytest.raises(DurableStorageError, match=f"'{missing}': the bucket 'no-such-bucket-here' does not exist"):
        durable_storage.check_reachable(missing)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    s3mod.forget_cached_filesystems()
    with pytest.raises(DurableStorageError, match=f"'{s3.url('checkpoints')}': access to the bucket "
                                                  f"'{s3.bucket}' is denied"):
        durable_storage.check_reachable(s3.url("checkpoints"))


def test_a_job_naming_an_unreachable_location_is_refused_naming_the_field(s3, monkeypatch) -> None:
    base = {"app": "mlr", "workers": 1, "servers": 1}
    ps_job_spec.check_storage(ps_job_spec.validate({**base, "output": s3.url("models", "m1")}))
    for field, change in (("output", {"output": "s3://no-such-bucket/m1"}),
                          ("resources.extra.resource",
                           {"resources": {"extra": {"resource": "s3://no-such-bucket/x.txt", "type": "FILE"}}})):
        spec = ps_job_spec.validate({**base, **change})
        with pytest.raises(JobSpecError, match="no-such-bucket") as e:
            ps_job_spec.check_storage(spec)
        assert e.value.field == field and "does not exist" in str(e.value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDWRONG")
    s3mod.forget_cached_filesystems()
    with pytest.raises(JobSpecError, match="is denied") as e:
        ps_job_spec.check_storage(ps_job_spec.validate({**base, "output": s3.url("models", "m1")}))
    assert e.value.field == "output" and s3.url("models", "m1") in str(e.value)


async def test_the_rm_answers_400_naming_the_url_of_a_missing_bucket(s3, tmp_path: Path) -> None:
    env = await make_env(tmp_path)
    try:
        new = await env.call("POST", BASE + "/apps/new-application")
        body = submission(new["application-id"], elastane={"ps-job": {
            "app": "mlr", "workers": 1, "servers": 1, "output": "s3://no-such-bucket/models/m1"}})
        body["application-type"] = "ELASTANE_PS"
        del body["am-container-spec"]["commands"]
        out = await env.call("POST", BASE + "/apps", body, status=400)
        err = out["RemoteException"]
        assert err["exception"] == "BadRequestException"
        assert "elastane.ps-job.output" in err["message"] and "s3://no-such-bucket/models/m1" in err["message"]
        # a YARN app's local resource in a missing bucket: the same, naming the entry
        body = submission(new["application-id"])
        body["am-container-spec"]["local-resources"] = {"entry": [
            {"key": "data.txt", "value": {"resource": "s3://no-such-bucket/data.txt", "type": "FILE",
                                          "visibility": "APPLICATION"}}]}
        out = await env.call("POST", BASE + "/apps", body, status=400)
        assert "local resource 'data.txt'" in out["RemoteException"]["message"]
        assert "s3://no-such-bucket/data.txt" in out["RemoteException"]["message"]
        assert (await env.call("GET", BASE + "/apps")) == {"apps": None}
        # the same submission with a reachable bucket is accepted
        body["am-container-spec"]["local-resources"]["entry"][0]["value"]["resource"] = s3.url("data.txt")
        await env.call("POST", BASE + "/apps", body, status=202)
    finally:
        await close_env(env)


def test_the_rm_does_not_start_with_a_checkpoint_dir_in_a_missing_bucket(s3, tmp_path: Path, capsys) -> None:
    from rm.__main__ import main as rm_main

    rm_toml = tmp_path / "rm.toml"
    rm_toml.write_text('[rm]\ncheckpoint_dir = "s3://no-such-bucket/elastane"\n')
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[cluster]\nsecret = "s"\n')
    assert rm_main(["--config", str(rm_toml), "--cluster-config", str(cluster), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint_dir" in err and "s3://no-such-bucket/elastane" in err and "does not exist" in err


# ----- data sets ---------------------------------------------------------------------------------------

def test_a_dataset_on_s3_reads_back_block_for_block(s3, tmp_path: Path) -> None:
    gen = create_app("mlr", {**SMALL_MLR, "seed": 3})
    write_generated(gen, str(tmp_path / "ds"))
    url = _upload_tree(s3, tmp_path / "ds", "datasets/mlr-small")
    # the job spec resolves its dimensions from the manifest in S3 (what the RM does at submission)
    spec = ps_job_spec.validate({"app": "mlr", "workers": 2, "servers": 1, "data": {"path": url, "seed": 3}})
    assert spec.app_data()["num_samples"] == SMALL_MLR["num_samples"]
    files = create_app("mlr", {"path": url, "seed": 3})
    assert files.num_blocks == gen.num_blocks
    for b in range(gen.num_blocks):
        want, got = gen.generate_block(b), files.input_block(b)
        for name, arr in want.data.items():
            assert np.array_equal(got.data[name], arr), (b, name)
    # a damaged or missing block file, and a missing dataset, name the object
    s3.filesystem().pipe_file(f"{s3.bucket}/datasets/mlr-small/train/block-000001.npz", b"not an npz")
    with pytest.raises(DatasetFileError, match=f"{url}/train/block-000001.npz: damaged block file"):
        create_app("mlr", {"path": url, "seed": 3}).input_block(1)
    with pytest.raises(DatasetError, match=f"cannot read {s3.url('nothing')}/dataset.json: no such file"):
        load_manifest(s3.url("nothing"))
    with pytest.raises(DatasetError, match="the bucket 'no-such-bucket' does not exist"):
        load_manifest("s3://no-such-bucket/ds")


# ----- staging and localization ------------------------------------------------------------------------

def test_shipped_files_are_staged_to_s3_and_the_nm_localizes_them(s3, tmp_path: Path) -> None:
    (tmp_path / "cfg.txt").write_text("lr=0.1\n")
    with tarfile.open(tmp_path / "bundle.tgz", "w:gz") as tf:
        data = os.urandom(4096)
        info = tarfile.TarInfo("w/weights.bin")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    shipped = ShippedFiles.from_flags(None, [str(tmp_path / "cfg.txt")], [str(tmp_path / "bundle.tgz")])
    resources = shipped.stage(s3.url("staging"), "alice", "application_1_0007")
    assert resources["cfg.txt"].resource == s3.url("staging", "alice", "application_1_0007", "cfg.txt")
    assert resources["cfg.txt"].size == 7 and resources["cfg.txt"].timestamp > 0
    # the NM's localizer fetches them from S3 and checks them against what the client saw
    node = tmp_path / "node"
    node.mkdir()
    localizer.fetch(resources["cfg.txt"], str(node / "cfg.txt"))
    assert (node / "cfg.txt").read_text() == "lr=0.1\n"
    localizer.fetch(resources["bundle.tgz"], str(node / "bundle"))
    assert (node / "bundle" / "w" / "weights.bin").read_bytes() == data
    changed = LocalResource(resources["cfg.txt"].resource, size=8)
    with pytest.raises(localizer.LocalizationError, match="size is 7 bytes"):
        localizer.fetch(changed, str(node / "cfg2.txt"))


def test_the_localizer_checks_the_object_as_it_is_now_not_a_cached_listing(s3, tmp_path: Path) -> None:
    """s3fs answers info() from a listing it cached; a file replaced since this process listed its
    directory must be checked (size, mtime) as it is now, or a resource the client staged after
    that listing is refused as 'changed since submission'."""
    import fsspec  # noqa: PLC0415

    other = s3.filesystem()
    key = f"{s3.bucket}/res/a.txt"
    other.pipe_file(key, b"one")
    fs, path = fsspec.core.url_to_fs(s3.url("res", "a.txt"))     # the instance the localizer gets
    assert [e["size"] for e in fs.ls(posixpath.dirname(path), detail=True)] == [3]    # listed, cached
    other.pipe_file(key, b"three33")
    now = other.info(key)
    res = LocalResource(s3.url("res", "a.txt"), size=7,
                        timestamp=int(now["LastModified"].timestamp() * 1000))
    localizer.fetch(res, str(tmp_path / "a.txt"))
    assert (tmp_path / "a.txt").read_bytes() == b"three33"


def test_staging_to_a_missing_bucket_or_with_wrong_keys_is_a_usage_error(s3, tmp_path, monkeypatch) -> None:
    (tmp_path / "cfg.txt").write_text("x")
    shipped = ShippedFiles.from_flags(None, [str(tmp_path / "cfg.txt")], None)
    with pytest.raises(UsageError, match="staging_dir: 's3://no-such-bucket/staging': the bucket") as e:
        shipped.stage("s3://no-such-bucket/staging", "alice", "application_1_0007")
    assert e.value.exit_code == EXIT_USAGE
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    s3mod.forget_cached_filesystems()
    with pytest.raises(UsageError, match="is denied") as e:
        shipped.stage(s3.url("staging"), "alice", "application_1_0007")
    assert e.value.exit_code == EXIT_USAGE
    assert s3.filesystem().find(s3.bucket) == []     # nothing uploaded
