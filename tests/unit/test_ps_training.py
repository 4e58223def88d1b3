"""The PS AM's training controller against real executors in this event loop (localhost sockets,
no RM): setup, BSP and SSP epochs, objective, metrics, status, checkpoints and the final model."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from appmaster.container_book import AmContainer
from protocol.checkpoint_manifest import JobRecord
from appmaster.ps.checkpoints import JOB_MANIFEST, Checkpointer
from appmaster.ps.runtime.executor_pool import ExecutorPool, ExecutorState, Role
from appmaster.ps.metrics import EpochRecord, JobMetrics
from appmaster.ps.runtime.executor_rpc import ExecutorCallError
from appmaster.ps.training import Training
from protocol.ps_job_spec import validate
from protocol.records import Resource
from psruntime.apps.registry import create_app
from psruntime.store.checkpoint import load_blocks, load_manifests
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.executor import Executor
from psruntime.wire.frame_codec import Frame


def _container(i: int) -> AmContainer:
    return AmContainer(container_id=f"container_1_0001_01_{i:06d}", node_id="n1:1", node_http_address="n1:1",
                       resource=Resource(256, 1), token="t")


class InProcessJob:
    """A pool of in-process executors wired like the AM wires real ones."""

    def __init__(self, spec_obj: dict) -> None:
        self.spec = validate(spec_obj)
        self.app = create_app(self.spec.app, self.spec.app_data(), self.spec.app_hparams())
        self.pool = ExecutorPool(self.spec.num_blocks, am_address="127.0.0.1:1")
        self.client = DataPlaneClient()
        self.metrics = JobMetrics()
        self.executors: list[Executor] = []
        self.ctl = Training.build(self.spec, self.app, self.pool, self.metrics, self.client)

    async def start(self) -> "InProcessJob":
        n = 0
        for role, count in ((Role.SERVER, self.spec.servers), (Role.WORKER, self.spec.workers)):
            for _ in range(count):
                n += 1
                rec = self.pool.add(role, _container(n + 1))
                ex = Executor(rec.executor_id, self.spec.num_blocks, role=role.value)
                self.executors.append(ex)
                address = await ex.start()
                self.pool.handle_frame(Frame({"op": "executor_ready", "executor_id": rec.executor_id,
                                              "address": address, "pid": 1}))
        return self

    async def setup(self) -> float:
        return await self.ctl.setup(self.pool.ready(Role.SERVER), self.pool.ready(Role.WORKER))

    async def close(self) -> None:
        if self.ctl.placement.placed:
            await self.ctl.placement.controller.close()
        await self.client.close()
        for ex in self.executors:
            await ex.stop()


@pytest.fixture
async def job_factory():
    jobs: list[InProcessJob] = []

    async def make(spec_obj: dict) -> InProcessJob:
        job = await InProcessJob(spec_obj).start()
        jobs.append(job)
        return job

    yield make
    for j in jobs:
        await j.close()


async def test_bsp_training_converges_and_checkpoints(job_factory, tmp_path) -> None:
    job = await job_factory({"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 4})
    initial = await job.setup()
    assert job.ctl.placement.table.owners == ["server-0", "server-1"] * 4        # round-robin, 8 blocks
    workers = job.pool.workers
    assert [w.partition for w in workers] == [0, 1] and all(w.data_bytes > 0 for w in workers)
    assert sorted(b for w in workers for b in w.blocks) == list(range(job.app.num_blocks))
    assert initial == pytest.approx(np.log(5), rel=1e-3)             # zero model: uniform softmax
    seen: list[EpochRecord] = []

    async def on_epoch(rec: EpochRecord) -> None:
        seen.append(rec)

    await job.ctl.loop.train(on_epoch)
    assert [r.epoch for r in seen] == [0, 1, 2, 3] and job.ctl.loop.epochs_done == 4 and job.ctl.loop.converged
    objectives = [r.objective for r in seen]
    assert all(b < a for a, b in zip([initial] + objectives, objectives)), objectives
    assert objectives[-1] < 0.8 * initial
    # the BSP objective is exact: recomputing it now gives the same number
    assert await job.ctl.evaluation.objective() == pytest.approx(objectives[-1], rel=1e-9)
    for w in workers:
        m = job.metrics.workers[w.executor_id]
        assert m.compute_s.count == 4 * 2000 // 50 // 2 and m.compute_s.value > 0 and m.comm_s.value > 0
    await job.ctl.status.refresh()
    assert all(e.rss_bytes > 0 for e in job.pool.executors.values())
    for s in job.pool.servers:     # served requests since setup's poll -> a mean service time
        times = job.metrics.servers[s.executor_id]
        assert times.requests > 0 and times.service_s.value is not None and times.service_s.value > 0
    assert sum(s.model_bytes for s in job.pool.servers) == job.app.model_nbytes()
    # a checkpoint covers every block, and the checkpointed model is the model
    ckpt = Checkpointer(tmp_path / "checkpoints", job.client)
    info = await ckpt.write(4, job.ctl.placement.table, job.pool.servers, JobRecord(objective=objectives[-1]))
    manifest = json.loads((tmp_path / "checkpoints" / "epoch-4" / JOB_MANIFEST).read_text())
    assert manifest["epoch"] == 4 and manifest["table"]["owners"] == job.ctl.placement.table.owners
    assert sorted(load_manifests(info.dir, job.spec.num_blocks)) == list(range(job.spec.num_blocks))
    assert len(list(Path(info.dir).glob("block_*.buf"))) == job.spec.num_blocks   # one file per block
    saved = {int(k): v for data in load_blocks(info.dir, job.spec.num_blocks).values()
             for k, v in zip(data.keys, data.values)}
    model = await job.ctl.evaluation.model()
    assert len(saved) == job.app.num_keys
    assert all(np.array_equal(saved[k], model[k]) for k in saved)
    metrics = await job.ctl.evaluation.evaluate()
    assert metrics["accuracy"] > 2 * metrics["chance_accuracy"]


async def test_ssp_training_reaches_the_epoch_limit(job_factory) -> None:
    job = await job_factory({"app": "lasso", "workers": 2, "servers": 1, "sync": "ssp", "staleness": 1,
                             "max_epochs": 5})
    initial = await job.setup()
    records: list[EpochRecord] = []

    async def on_epoch(rec: EpochRecord) -> None:
        records.append(rec)

    await job.ctl.loop.train(on_epoch)
    assert [r.epoch for r in records][:3] == [0, 1, 2] and job.ctl.loop.converged
    assert records[-1].objective < 0.5 * initial


async def test_a_dead_executor_is_named(job_factory) -> None:
    job = await job_factory({"app": "nmf", "workers": 2, "servers": 1, "max_epochs": 3})
    await job.setup()
    await job.executors[-1].stop()            # worker-1 goes away
    with pytest.raises(ExecutorCallError) as e:
        async def on_epoch(rec: EpochRecord) -> None:
            pass
        await job.ctl.loop.train(on_epoch)
    assert e.value.executor.executor_id == "worker-1" and "worker" in str(e.value)
    assert job.pool.executors["worker-1"].state is ExecutorState.READY   # the container's exit decides
