"""A checkpoint taken around an EPS change that stops servers asks only the servers that own blocks.

The race (behind jobs a Harmony run of bench/harmony_colocation.py harmony_no_spill lost with
"checkpoint_blocks on server-N ... connection lost"): a checkpoint takes the job's server list,
and an executor in it that owns no block -- a server an EPS addition started, which its failed
change retires before any block reached it, or one an EPS removal drained -- is stopped by the AM
before its checkpoint_blocks request is answered. The checkpoint must not ask it (it has nothing
to give), and the job must not fail for an executor it retired on purpose; a lost server that
does own blocks still fails the checkpoint, so the master's recovery takes the loss. Under the
PS-job controller the final checkpoint waits for the change slot, so it comes after the failed
addition's retire; the first test pins that end to end on the real AM (tests/support/ps_inprocess.py),
the second the checkpointer's choice of servers on real executors (store_cluster.py)."""
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
from appmaster.ps.runtime.executor_pool import ExecutorRecord, ExecutorState, Role
from appmaster.ps.runtime.executor_rpc import ExecutorCallError
from protocol.records import FinalStatus
from protocol.remote_exception import ApiError
from protocol.records import Resource
from psruntime.store.checkpoint import load_blocks
from psruntime.store.store_client import StoreClient
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.wire.frame_codec import Frame
from ps_inprocess import SPEC, PsJob
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
    j = PsJob(tmp_path / "job", {**SPEC, "max_epochs": 3})
    yield j
    await j.close()


async def test_the_final_checkpoint_survives_a_failed_addition_retiring_its_new_server(job: PsJob,
                                                                                      tmp_path: Path) -> None:
    master = job.master
    held = HeldCheckpoints(master.client)
    held.release.set()                    # recorded, not held: the controller orders it after the retire
    servers = ["server-0", "server-1"]
    scaled: list[asyncio.Future[Any]] = []
    clocks_per_epoch = 2000 // 50 // 2 // SPEC["clock_batches"]

    def at_epoch_end() -> None:
        if job.loop.clocks_done == clocks_per_epoch and not scaled:
            # The final checkpoint's requests are recorded from now on (the initial one is done).
            master.steps.checkpointer = Checkpointer(tmp_path / "final", held)  # type: ignore[arg-type]
            # A /scale adds a server between epochs; its executor starts slowly ...
            job.am.launch_gate = asyncio.Event()
            scaled.append(asyncio.ensure_future(master.request_scale(0, 1)))
            # ... and training ends first (early stopping): the blocks never move to it, the
            # change fails and retires the new server, which got no block.
            job.loop.stop_early("held-out quality stopped improving")
    job.trigger_after_clock(at_epoch_end)
    job.start()
    await job.until(lambda: bool(job.job.training_criterion), "training's end")
    assert job.job.change is not None and job.job.change.kind.value == "eps"     # the final checkpoint waits
    assert job.am.launch_gate is not None
    job.am.launch_gate.set()
    assert await job.run() is FinalStatus.SUCCEEDED

    with pytest.raises(ApiError, match=r"add_servers\(1\) failed"):
        await scaled[0]
    assert [e.epoch for e in job.epochs] == [0]
    new = job.pool.executors["server-2"]
    assert new.container_id in master.steps.retiring and new.state is not ExecutorState.READY
    assert master.eps_history[-1].op == "add_servers" and "not running" in master.eps_history[-1].error
    assert job.training.membership.server_ids() == servers
    # Only the block owners were asked, and between them the checkpoint holds every block.
    owners = [job.pool.executors[s].address for s in servers]
    assert sorted(held.asked) == sorted(owners) and new.address not in held.asked
    info = master.steps.checkpointer.last         # the final checkpoint
    assert info is not None
    d = Path(info.dir)
    assert json.loads((d / "job.json").read_text())["servers"] == servers
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
        d = Path(info.dir)
        assert sorted(p.name for p in d.glob("manifest-*.json")) == ["manifest-e0.json", "manifest-e1.json"]
        assert sorted(load_blocks(d, NB)) == list(range(NB))

        # A server that owns blocks and is gone: the checkpoint fails naming it (the master's
        # recovery takes that loss), rather than leaving its blocks out.
        await executors[1].stop()
        with pytest.raises(ExecutorCallError, match="checkpoint_blocks on e1"):
            await Checkpointer(tmp_path / "again", dp).write(2, ctl.table, recs, JobRecord())
