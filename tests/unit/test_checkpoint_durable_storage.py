"""Checkpoints in durable storage every host reads: attempt 1's AM writes them under the app's
durable dir (a local path, a file:// URL, or an fsspec URL: memory:// here, standing for s3://),
and attempt 2 -- a new Checkpointer on the same location with its own local disk, as on another
host -- finds the latest complete one, fetches it and restores the model onto fresh servers."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest

from appmaster.ps import checkpoints
from appmaster.ps.checkpoints import JOB_MANIFEST, Checkpointer
from protocol.checkpoint_manifest import JobCheckpoint, JobRecord
from appmaster.ps.runtime.executor_pool import ExecutorRecord
from appmaster.ps.job_resume import resumable_checkpoint, resume_job
from appmaster.ps.metrics import JobMetrics
from protocol.durable_storage import DurableDir
from protocol.ps_job_spec import validate
from protocol.ps_status import EpochResult
from protocol.shape_history import EpsChange, ExecutorCounts
from psruntime.apps.registry import create_app
from psruntime.store.checkpoint import load_blocks
from psruntime.store.migration_controller import MigrationController
from store_cluster import executor_cluster, pull_values, put_values, server_record

NB = 8
SPEC = validate({"app": "mlr", "workers": 1, "servers": 2})
ADDED = EpsChange(changed=True, op="add_workers", requested=1, before=ExecutorCounts(1, 2), workers=2, servers=2,
                  time=1000.0, seconds=1.5, lost_s=0.2)     # a shape change the job made before the checkpoint


async def _put(ctl: MigrationController, scale: float) -> dict[int, np.ndarray]:
    model = {k: np.arange(4, dtype=np.float32) * scale + k for k in range(64)}
    await put_values(ctl, model)
    return model


def _job(epoch: int) -> JobRecord:
    """What master.job_record puts in a checkpoint, for `epoch` epochs trained."""
    history = [EpochResult(epoch=e, objective=1.0 / (e + 1), epoch_time_s=0.5, time=1000.0 + e) for e in range(epoch)]
    return JobRecord(spec=SPEC, attempt_id="appattempt_1_0001_000001", initial_objective=2.0,
                     objective_history=history, shape_history=[ADDED],
                     iterations=10 * epoch, clocks=2 * epoch, minibatches_run=40 * epoch)


class _Steps:
    """The part of the reconfiguration layer resume_job uses: restore the checkpoint's model."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer
        self.continued_from: list[tuple[str, JobCheckpoint]] = []

    async def continue_from_checkpoint(self, servers: list[ExecutorRecord], workers: list[ExecutorRecord],
                                       directory: str, manifest: JobCheckpoint) -> float:
        self.continued_from.append((directory, manifest))
        await self.checkpointer.restore(directory, servers, NB)
        return 0.25


@pytest.fixture(params=["path", "file", "memory"])
def location(request, tmp_path) -> str:
    """The app's durable dir as the RM would pass it (ELASTANE_AM_DIR)."""
    if request.param == "path":
        return str(tmp_path / "shared" / "app_1")
    if request.param == "file":
        return f"file://{tmp_path}/shared/app_1"
    return f"memory://elastane-{uuid.uuid4().hex}/apps/app_1"


async def test_attempt_2_resumes_from_attempt_1s_latest_checkpoint(location, tmp_path) -> None:
    durable = DurableDir(location).child("checkpoints")
    # attempt 1, on host A: two checkpoints, the second one at epoch 2 clock 3; then a third, newer
    # one that never got its job.json (the host died while writing it)
    async with executor_cluster(2, NB) as (executors, ctl, dp):
        recs = [server_record(e, i) for i, e in enumerate(executors)]
        first = Checkpointer(durable, dp, staging=tmp_path / "host-a")
        await _put(ctl, 1.0)
        await first.write(1, ctl.table, recs, _job(1))
        model = await _put(ctl, 2.0)
        info = await first.write(2, ctl.table, recs, _job(2), clock=3)
        assert info.url == durable.child("epoch-2-clock-3").url
        await _put(ctl, 3.0)
        await first.write(3, ctl.table, recs, _job(3))
    dirs, _ = durable.entries()
    assert dirs == ["epoch-2-clock-3", "epoch-3"]      # the newest two are kept (KEEP_CHECKPOINTS)
    torn = durable.child("epoch-3")
    if torn.local is not None:
        (torn.local / JOB_MANIFEST).unlink()
    else:
        fsspec.filesystem("memory").rm(f"{torn.url}/{JOB_MANIFEST}")

    # attempt 2, on host B: the same location, its own local disk, fresh servers
    async with executor_cluster(3, NB) as (executors, ctl, dp):
        recs = [server_record(e, i) for i, e in enumerate(executors)]
        second = Checkpointer(durable, dp, staging=tmp_path / "host-b")
        latest = resumable_checkpoint(second, SPEC, create_app(SPEC.app, SPEC.app_data(), SPEC.app_hparams()))
        assert latest is not None and (latest.record.epoch, latest.record.clock) == (2, 3)
        assert latest.url == durable.child("epoch-2-clock-3").url
        steps = _Steps(second)
        metrics = JobMetrics()
        resumed = await resume_job(latest, recs, [], metrics, steps)  # type: ignore[arg-type]
        directory, manifest = steps.continued_from[0]
        assert Path(directory).is_dir() and directory == resumed.dir and manifest.epoch == 2
        if durable.local is None:         # fetched into host B's own disk
            assert Path(directory).parent == tmp_path / "host-b"
        assert sorted(load_blocks(directory, NB)) == list(range(NB))
        got = await pull_values(ctl, list(model))
        for k, v in model.items():
            np.testing.assert_array_equal(got[k], v)
        assert [e.epoch for e in metrics.epochs] == [0, 1] and metrics.initial_objective == 2.0
        assert (resumed.epoch, resumed.clock, resumed.url) == (2, 3, latest.url)
        assert resumed.objective_restored == 0.25
        assert latest.record.shape_history == [ADDED] and latest.record.spec == SPEC


async def test_only_the_newest_checkpoints_are_kept_and_a_torn_old_one_goes_too(location, tmp_path) -> None:
    """A job checkpointing every epoch for days would fill the store with a model copy an epoch:
    the durable dir keeps the newest KEEP_CHECKPOINTS, whatever the store."""
    durable = DurableDir(location).child("checkpoints")
    durable.child("epoch-0-clock-1").makedirs()            # an interrupted write of an earlier attempt
    durable.child("epoch-0-clock-1").write_bytes("blocks-0.bin", b"partial")
    async with executor_cluster(2, NB) as (executors, ctl, dp):
        recs = [server_record(e, i) for i, e in enumerate(executors)]
        ckpt = Checkpointer(durable, dp, staging=tmp_path / "stage")
        for epoch in range(1, 5):
            await _put(ctl, float(epoch))
            await ckpt.write(epoch, ctl.table, recs, _job(epoch))
            kept = durable.entries()[0]
            assert kept == [f"epoch-{e}" for e in range(max(1, epoch - checkpoints.KEEP_CHECKPOINTS + 1), epoch + 1)]
        latest = ckpt.latest()
        assert latest is not None and latest.record.epoch == 4
    assert checkpoints.checkpoint_position("epoch-12-clock-3") == (12, 3)
    assert checkpoints.checkpoint_position("epoch-7") == (7, 0) and checkpoints.checkpoint_position("notes") is None


async def test_no_checkpoint_means_starting_over(location, tmp_path) -> None:
    async with executor_cluster(1, NB) as (_, _ctl, dp):
        ckpt = Checkpointer(DurableDir(location).child("checkpoints"), dp, staging=tmp_path / "stage")
        assert ckpt.latest() is None
        assert resumable_checkpoint(ckpt, SPEC, create_app(SPEC.app, SPEC.app_data(), SPEC.app_hparams())) is None


async def test_a_remote_checkpoint_is_staged_locally_then_put_with_job_json_last(tmp_path, monkeypatch) -> None:
    durable = DurableDir(f"memory://elastane-{uuid.uuid4().hex}/apps/app_1").child("checkpoints")
    puts: list[str] = []
    real_put, real_write = DurableDir.put_files, DurableDir.write_bytes

    def put_files(self: DurableDir, sources: list[Path]) -> None:
        puts.extend(p.name for p in sources)
        real_put(self, sources)

    def write_bytes(self: DurableDir, name: str, data: bytes) -> None:
        puts.append(name)
        real_write(self, name, data)

    monkeypatch.setattr(DurableDir, "put_files", put_files)
    monkeypatch.setattr(DurableDir, "write_bytes", write_bytes)
    async with executor_cluster(2, NB) as (executors, ctl, dp):
        recs = [server_record(e, i) for i, e in enumerate(executors)]
        ckpt = Checkpointer(durable, dp, staging=tmp_path / "stage")
        await _put(ctl, 1.0)
        for epoch in (1, 2, 3):
            info = await ckpt.write(epoch, ctl.table, recs, _job(epoch))
            assert Path(info.dir).parent == tmp_path / "stage"           # restores read the local copy
            assert json.loads((Path(info.dir) / JOB_MANIFEST).read_text())["epoch"] == epoch
    assert puts[-1] == JOB_MANIFEST and puts.count(JOB_MANIFEST) == 3
    first = puts[:puts.index(JOB_MANIFEST)]
    assert sorted(first) == sorted([f"block_{b}.buf" for b in range(NB)] + ["manifest-e0.json", "manifest-e1.json"])
    assert sorted(p.name for p in (tmp_path / "stage").iterdir()) == ["epoch-2", "epoch-3"]   # older copies go
    assert durable.entries()[0] == ["epoch-2", "epoch-3"]      # the durable copies too: the newest two


async def test_a_local_checkpoint_is_durable_before_job_json_commits_it(tmp_path, monkeypatch) -> None:
    synced: list[str] = []
    real = checkpoints.fsync_file

    def fsync_file(path: Path) -> None:
        assert not (Path(path).parent / JOB_MANIFEST).exists(), "job.json committed before a file it covers"
        synced.append(Path(path).name)
        real(path)

    dirs_synced: list[Path] = []
    real_dir = checkpoints.fsync_dir

    def fsync_dir(path: Path) -> None:
        if not (Path(path) / JOB_MANIFEST).exists():
            dirs_synced.append(Path(path))
        real_dir(path)

    monkeypatch.setattr(checkpoints, "fsync_file", fsync_file)
    monkeypatch.setattr(checkpoints, "fsync_dir", fsync_dir)
    async with executor_cluster(2, NB) as (executors, ctl, dp):
        recs = [server_record(e, i) for i, e in enumerate(executors)]
        ckpt = Checkpointer(tmp_path / "checkpoints", dp)
        assert not ckpt.staged and ckpt.root == tmp_path / "checkpoints"      # written in place
        await _put(ctl, 1.0)
        info = await ckpt.write(1, ctl.table, recs, _job(1))
    assert info.dir == str(tmp_path / "checkpoints" / "epoch-1") == info.url
    assert sorted(synced) == sorted([f"block_{b}.buf" for b in range(NB)] + ["manifest-e0.json", "manifest-e1.json"])
    assert tmp_path / "checkpoints" / "epoch-1" in dirs_synced      # the files' renames, before job.json
    assert json.loads((tmp_path / "checkpoints" / "epoch-1" / JOB_MANIFEST).read_text())["epoch"] == 1
