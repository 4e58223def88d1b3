"""A new AM attempt takes over the executors a failed attempt left running, against the real AM
(the PS-job controller and its interpreter) over real in-process executors
(tests/support/ps_inprocess.py). The first AM dies in the middle of an epoch (its run task is
cancelled: its connections close, its executors go on); a second AM on the same AM dir is handed
the containers, checks them against the record the first left, and trains on: nothing launched or
restored, no epoch redone, every mini-batch applied once (the audit), the same objective as an
undisturbed run. A record the executors contradict is refused: the executors are stopped and the
job starts afresh from its checkpoint on new ones."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from appmaster.ps.attempt_takeover import read_handover
from protocol.attempt_handover import HANDOVER_FILE
from protocol.durable_storage import DurableDir
from protocol.records import FinalStatus
from ps_inprocess import SPEC, PsJob

JOB = {**SPEC, "max_epochs": 5, "checkpoint_every_epochs": 2}
SECOND_ATTEMPT = "appattempt_1700000000000_0001_000002"


async def first_attempt_dies_mid_epoch(tmp_path: Path, epoch: int = 2) -> PsJob:
    """The first attempt trains until a clock inside `epoch` with its record on disk for the epochs
    done, then dies (its AM only: the executors keep running)."""
    first = PsJob(tmp_path, JOB)
    am_dir = DurableDir(tmp_path / "am")
    died = asyncio.Event()

    def hook() -> None:
        loop = first.loop
        if died.is_set() or loop.epochs_done < epoch:
            return
        record = read_handover(am_dir)
        mid = any(e == loop.epochs_done and row > 0 for e, row in loop.positions.values())
        if mid and record is not None and record.epochs_done == loop.epochs_done:
            died.set()
    first.trigger_after_clock(hook)
    first.start()
    await asyncio.wait_for(died.wait(), 60)
    assert first._run is not None
    first._run.cancel()          # the AM is gone; nothing it would do on a clean exit happens
    await asyncio.gather(first._run, return_exceptions=True)
    return first


def second_attempt(tmp_path: Path, first: PsJob) -> PsJob:
    """A second AM on the same AM dir, handed the first's executor containers."""
    second = PsJob(tmp_path, JOB)
    second.am.identity.attempt_id = SECOND_ATTEMPT
    second.am.handed = [r.container for r in first.pool.executors.values()]
    second.am.executors.update(first.am.executors)
    return second


@pytest.fixture
async def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    job = PsJob(tmp_path_factory.mktemp("undisturbed"), JOB)
    try:
        assert await job.run() is FinalStatus.SUCCEEDED
        yield job
    finally:
        await job.close()


async def test_the_second_attempt_takes_the_executors_over_and_trains_on(tmp_path: Path, undisturbed: PsJob) -> None:
    first = await first_attempt_dies_mid_epoch(tmp_path)
    second = second_attempt(tmp_path, first)
    try:
        assert await second.run() is FinalStatus.SUCCEEDED
        st = second.master.status()
        taken = st.resumed_from
        assert taken is not None and taken.adopted and taken.executors_adopted == 4 and taken.epoch == 2, taken
        assert second.am.asks == []                         # no executor started anew
        assert set(second.pool.executors) == set(first.pool.executors)
        assert [e.epoch for e in second.epochs] == list(range(5))      # none redone or skipped
        assert second.loop.audit_mismatches == [] and second.loop.minibatches_applied == second.loop.minibatches_run
        assert second.loop.minibatches_run == undisturbed.loop.minibatches_run     # every mini-batch once
        final, expected = second.epochs[-1].objective, undisturbed.epochs[-1].objective
        assert final == pytest.approx(expected, rel=0.01)
        assert second.job.checkpoints and second.job.checkpoints[0][0] == 2    # the first's latest: epoch 2
    finally:
        await second.close()
        await first.close()


async def test_a_record_the_executors_contradict_is_refused_and_the_job_starts_over(tmp_path: Path) -> None:
    first = await first_attempt_dies_mid_epoch(tmp_path)
    am_dir = DurableDir(tmp_path / "am")
    record = read_handover(am_dir)
    assert record is not None
    # As if a block move had been under way: the record names an older table than the executors hold.
    am_dir.write_bytes(HANDOVER_FILE, msgspec.json.encode(msgspec.structs.replace(
        record, table_version=record.table_version - 1)))
    second = second_attempt(tmp_path, first)
    try:
        assert await second.run() is FinalStatus.SUCCEEDED
        st = second.master.status()
        resumed = st.resumed_from
        assert resumed is not None and not resumed.adopted and resumed.epoch == 2, resumed   # the checkpoint's
        assert {tag for tag, _, _ in second.am.asks} == {"server", "worker"}    # new executors
        old = set(first.pool.executors)
        assert all(first.am.executors[x].stopped.is_set() for x in old)          # the handed-over stopped
        assert [e.epoch for e in second.epochs] == list(range(5))
    finally:
        await second.close()
        await first.close()
