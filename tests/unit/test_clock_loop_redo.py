"""A clock a lost worker's replacement runs again: when the replacement is lost too, the clock the
survivors ran (and pushed) is counted before the failure goes up, as it is when there is no
replacement at all. Uncounted, the clock was issued again: an exactly-once audit saw a mismatch and
the survivors' push logs dropped the clock's applied pushes (a later server rebuild lost them)."""
from __future__ import annotations

import types

import pytest

from appmaster.ps.clock_loop import ClockLoop
from appmaster.ps.runtime.executor_rpc import Answered, ExecutorLost
from protocol import executor_ops as ops
from protocol.executor_replies import RunClockReply
from psruntime.wire.dataplane import PeerLost


def worker(i: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(executor_id=f"worker-{i}", role=types.SimpleNamespace(value="worker"),
                                 container_id=f"c{i}", address=f"h:{i}")


def clock_loop() -> ClockLoop:
    loop = ClockLoop.__new__(ClockLoop)
    loop.metrics = types.SimpleNamespace(record_batches=lambda *a, **k: None)   # type: ignore[assignment]
    loop.pacer = types.SimpleNamespace(observe=lambda *a: None)                 # type: ignore[assignment]
    loop.positions, loop.slowest_clock_s, loop.on_clock = {0: (2, 0)}, 0.0, None
    loop.iterations = loop.minibatches_run = 0
    loop.clocks_done = 41
    return loop


@pytest.mark.parametrize("replaced", [True, False])
async def test_the_survivors_clock_is_counted_when_the_redo_fails_or_has_no_replacement(replaced: bool) -> None:
    loop = clock_loop()
    w0, w1, w2 = worker(0), worker(1), worker(2)

    async def replace(lost: object) -> list[types.SimpleNamespace]:
        return [w2]

    async def calls(workers: list[types.SimpleNamespace], request: object) -> list[BaseException]:
        # The replacement is lost too while it runs the clock again.
        return [ExecutorLost(w, "run_clock", PeerLost(w.address, "container exited")) for w in workers]
    loop.replace_lost_workers = replace if replaced else None    # type: ignore[assignment]
    loop._clock_calls = calls                                    # type: ignore[method-assign]
    survivor = Answered(RunClockReply(epoch=2, batches=10, epoch_done=False, seconds=1.0,
                                      positions={"0": [2, 320]}), [])
    request = ops.RunClock(epoch=2, batches=10, num_workers=2, clock=41)
    with pytest.raises(ExecutorLost):
        await loop._redo_lost(request, [(w1, ExecutorLost(w1, "run_clock", PeerLost("h:1", "gone")))],
                              [(w0, survivor)])      # type: ignore[list-item]
    assert loop.clocks_done == 42
    assert loop.minibatches_run == 10 and loop.positions[0] == (2, 320)
