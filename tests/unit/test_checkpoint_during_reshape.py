"""A checkpoint taken while an EPS change stops servers asks only the servers that own blocks.

The race (behind jobs a Harmony run of bench/harmony_colocation.py harmony_no_spill lost with
"checkpoint_blocks on server-N ... connection lost"): a checkpoint takes the job's server list,
and an executor in it that owns no block -- a server an EPS addition started, which its failed
change retires before any block reached it, or one an EPS removal drained -- is stopped by the AM
before its checkpoint_blocks request is answered. The checkpoint must not ask it (it has nothing
to give), and the job must not fail for an executor it retired on purpose; a lost server that
does own blocks still fails the checkpoint, so the master's recovery takes the loss.

Real in-process executors (tests/support/ps_inprocess.py, store_cluster.py); the checkpoint's
requests are held until the retire is done, which is what makes the interleaving deterministic."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from appmaster.container_book import AmContainer
from protocol.checkpoint_manifest import JobRecord
from appmaster.ps.checkpoints import Checkpointer
from appmaster.ps.elastic_ops import ElasticBusy, ElasticOps
from appmaster.ps.executor_pool import ExecutorRecord, ExecutorState, Role
from appmaster.ps.executor_rpc import ExecutorCallError
from appmaster.ps.job import JobPhase
from appmaster.ps.metrics import EpochRecord
from polling import async_wait_until
from protocol.records import Resource
from psruntime.store.checkpoint import load_blocks
from psruntime.store.store_client import StoreClient
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.wire.frame_codec import Frame
from ps_inprocess import SPEC, Job
from store_cluster import executor_cluster

NB = 8


class HeldCheckpoints:
    """The checkpointer's data-plane client: every checkpoint_blocks request waits for `release`
    (a busy AM, a slow link) and is recorded; the servers asked are decided before it waits."""

    def __init__(self, client: DataPlaneClient) -> None:
        self.client = client
        self.release = asyncio.Event()
        self.asked: list[str] = []

    async def request(self, address: str, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> Frame:
        if header.get("op") == "checkpoint_blocks" and header.get("cut") is None:
            self.asked.append(address)
            await self.release.wait()
        return await self.client.request(address, header, list(arrays))

    def lost(self, address: str) -> str | None:
        return self.client.lost(address)


@pytest.fixture
async def job(tmp_path: Path):
    j = Job(tmp_path / "job", {**SPEC, "max_epochs": 3})
    yield j
    await j.close()


async def test_the_final_checkpoint_survives_a_failed_addition_retiring_its_new_server(job: Job,
                                                                                      tmp_path: Path) -> None:
    await job.setup()
    held = HeldCheckpoints(job.client)
    job.steps.checkpointer = Checkpointer(tmp_path / "final", held)  # type: ignore[arg-type]
    elastic = ElasticOps(job.spec, job.steps, lambda: JobPhase.TRAINING)
    servers = job.training.membership.servers
    adding: asyncio.Future[Any] | None = None

    async def on_epoch(rec: EpochRecord) -> None:
        nonlocal adding
        job.epochs.append(rec)
        if rec.epoch == 0:
            # A directive adds a server between epochs: it joins the server list at once, its
            # blocks would move alongside the next epoch ...
            adding = asyncio.ensure_future(elastic.add_servers(1))
            await async_wait_until(lambda: len(job.training.membership.servers) == 3, 10,
                                   "the new server in the server list", interval_s=0)
            # ... but training ends first (early stopping): the move never runs, the change fails
            # and retires the new server, which got no block.
            job.training.loop.stop_early("held-out quality stopped improving")

    await job.training.loop.train(on_epoch)
    assert adding is not None and [e.epoch for e in job.epochs] == [0]
    new = next(s for s in job.training.pool.of_role(Role.SERVER) if s not in servers)
    # What the master does once training returns: the final checkpoint, of the server list as it
    # is now -- which still names the new server, whose retire runs meanwhile. Its requests travel
    # once the failed change has stopped that server.
    adding.add_done_callback(lambda _: held.release.set())
    info = await job.steps.checkpoint(job.training.loop.epochs_done, JobRecord())

    with pytest.raises(ElasticBusy, match="training ended"):
        await adding
    assert new.state is ExecutorState.RETIRING and new.container_id in job.steps.retiring
    assert job.training.membership.servers == servers
    # Only the block owners were asked, and between them the checkpoint holds every block.
    assert sorted(held.asked) == sorted(s.address for s in servers) and new.address not in held.asked
    d = Path(info["dir"])
    assert json.loads((d / "job.json").read_text())["servers"] == [s.executor_id for s in servers]
    assert sorted(load_blocks(d, job.spec.num_blocks)) == list(range(job.spec.num_blocks))


def _record(executor_id: str, address: str, seq: int) -> ExecutorRecord:
    c = AmContainer(container_id=f"container_1_0001_01_{seq:06d}", node_id="n1:1", node_http_address="n1:1",
                    resource=Resource(512, 1), token="t")
    return ExecutorRecord(executor_id, Role.SERVER, c, ExecutorState.READY, address)


async def test_a_drained_server_that_is_gone_is_not_asked_but_a_lost_owner_fails_the_checkpoint(
        tmp_path: Path) -> None:
    async with executor_cluster(3, NB) as (executors, ctl, dp):
        model = {k: np.full(4, float(k), np.float32) for k in range(64)}
        c = StoreClient(ctl.table)
        await c.put(list(model), list(model.values()))
        await c.close()
        recs = [_record(e.executor_id, e.address, i) for i, e in enumerate(executors)]
        # An EPS removal: e2's blocks move to e0, then its container is stopped (it is retiring).
        await ctl.move(ctl.table.blocks_owned_by("e2"), "e2", "e0")
        await executors[2].stop()

        info = await Checkpointer(tmp_path, dp).write(1, ctl.table, recs, JobRecord())   # the list still names e2
        d = Path(info["dir"])
        assert sorted(p.name for p in d.glob("manifest-*.json")) == ["manifest-e0.json", "manifest-e1.json"]
        assert sorted(load_blocks(d, NB)) == list(range(NB))

        # A server that owns blocks and is gone: the checkpoint fails naming it (the master's
        # recovery takes that loss), rather than leaving its blocks out.
        await executors[1].stop()
        with pytest.raises(ExecutorCallError, match="checkpoint_blocks on e1"):
            await Checkpointer(tmp_path / "again", dp).write(2, ctl.table, recs, JobRecord())
