"""The active's lease renewals (rm/ha/elector.py) on a fake clock and a fake etcd: two lost
renewals in a row -- failed at once, or timed out -- leave time for a third before the lease's
deadline (docs/operating.md, "The lease"), and renewals that keep failing step the RM down at the
deadline, never later, with no renewal sent at or past it."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, Awaitable, Callable

import pytest

from fakes import FakeClock
from protocol.ha_config import HAConfig
from rm.ha.elector import Elector
from rm.ha.etcd_kv import AsyncEtcd, EtcdUnavailable
from rm.ha.role import HAEvent, HAState

TOKEN = 42


class LoopStopped(Exception):
    """Ends the elector's loop from its wait (the test's stop condition was met)."""


class FakeEtcdClient:
    """aetcd's client as the renewal uses it: `refresh_lease` answers as `plan` says for each
    call (1-based): "ok", "fail" (no member answered at once) or "stall" (no answer for the
    elector's whole per-call wait, then the failure its timeout raises)."""

    def __init__(self, clock: FakeClock, lease_s: float, stall_s: float, plan: Callable[[int], str]):
        self.clock, self.lease_s, self.stall_s, self.plan = clock, lease_s, stall_s, plan
        self.sent: list[float] = []
        self.transactions = SimpleNamespace(create=lambda key: SimpleNamespace())

    async def refresh_lease(self, lease_id: int) -> Any:
        self.sent.append(self.clock())
        what = self.plan(len(self.sent))
        if what == "stall":
            self.clock.advance(self.stall_s)
        if what != "ok":
            raise EtcdUnavailable(f"no etcd member answered (renewal {len(self.sent)})")
        return SimpleNamespace(TTL=int(self.lease_s), header=SimpleNamespace(revision=100))

    async def transaction(self, compare: list[Any], success: list[Any], failure: list[Any]) -> Any:
        return True, []


class FakeAsyncEtcd:
    def __init__(self, client: FakeEtcdClient):
        self.client = client

    async def call(self, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        return await fn(self.client)

    async def close(self) -> None:
        pass


def active_elector(lease_s: float, plan: Callable[[int], str]) -> tuple[Elector, FakeClock, FakeEtcdClient]:
    """An elector in an ACTIVE term whose lease was granted by a request sent at t=100."""
    ha = HAConfig(enabled=True, rm_ids=["rm1", "rm2"],
                  rm_addresses={"rm1": "http://127.0.0.1:1", "rm2": "http://127.0.0.1:2"},
                  etcd_endpoints=["http://127.0.0.1:9"], lease_s=lease_s, compaction_interval_s=0)
    clock = FakeClock(100.0)

    async def on_active(epoch: int, token: int) -> None:
        pass

    async def on_standby(reason: str) -> None:
        pass
    el = Elector(ha, "rm1", on_active, on_standby, clock=clock)
    # What one call may wait before it fails (the elector's own per-call timeout).
    client = FakeEtcdClient(clock, lease_s, el.etcd.timeout_s, plan)
    el.etcd = FakeAsyncEtcd(client)     # type: ignore[assignment]
    el.role.start(clock())
    el.role.elected(clock(), epoch=1, token=TOKEN, lease_granted_at=clock())
    el.role.fire(HAEvent.RECOVERED, clock(), "recovered")
    el.lease_id = 7
    return el, clock, client


async def run_loop(el: Elector, clock: FakeClock, until: Callable[[], bool]) -> None:
    """The elector's own loop, its waits passing on the fake clock, until `until()` holds."""
    async def wait(seconds: float) -> None:
        assert seconds >= 0
        clock.advance(seconds)
        if until():
            raise LoopStopped
    el._wait = wait     # type: ignore[method-assign]
    with pytest.raises(LoopStopped):
        await el._run()


# Two renewals that time out need a lease of 3 s or more: a renewal waits at least 0.5 s
# (elector.py), so a 2 s lease survives two failed at once, not two unanswered.
@pytest.mark.parametrize("lease_s,lost", [(2.0, "fail"), (3.0, "fail"), (5.0, "fail"), (6.0, "fail"),
                                          (3.0, "stall"), (5.0, "stall"), (6.0, "stall")])
async def test_two_lost_renewals_in_a_row_leave_time_for_a_third(lease_s, lost):
    el, clock, etcd = active_elector(lease_s, lambda n: lost if n in (2, 3) else "ok")
    await run_loop(el, clock, lambda: len(etcd.sent) >= 4 or el.role.state != HAState.ACTIVE)
    assert el.role.state == HAState.ACTIVE, el.role.reason
    first_ok = etcd.sent[0]
    # The third try after the acknowledged one went out before that one's lease ran out, and
    # its acknowledgement renewed the lease from its own send time.
    assert etcd.sent[3] < first_ok + lease_s
    assert el.role.renewed_at == etcd.sent[3]
    assert el.may_act()


@pytest.mark.parametrize("lost", ["fail", "stall"])
async def test_renewals_that_keep_failing_step_down_at_the_deadline_never_past_it(lost):
    lease_s = 6.0
    el, clock, etcd = active_elector(lease_s, lambda n: "ok" if n == 1 else lost)
    await run_loop(el, clock, lambda: el.role.state != HAState.ACTIVE)
    deadline = etcd.sent[0] + lease_s
    change = el.role.history[-1]
    assert change.event == HAEvent.LEASE_EXPIRED and change.new == HAState.STANDBY
    assert change.at == pytest.approx(deadline)
    assert len(etcd.sent) >= 4 and all(t < deadline for t in etcd.sent)
    assert not el.may_act()


class HangingClient(FakeEtcdClient):
    """A member that takes a request and never answers (a host cut off without a reset)."""

    async def refresh_lease(self, lease_id: int) -> Any:
        self.sent.append(self.clock())
        await asyncio.Event().wait()


async def test_a_renewal_that_gets_no_answer_is_cut_at_its_bound_and_the_next_goes_to_another_member():
    el, clock, _ = active_elector(6.0, lambda n: "ok")
    hanging, answering = HangingClient(clock, 6.0, 0, lambda n: "ok"), FakeEtcdClient(clock, 6.0, 0, lambda n: "ok")
    etcd = AsyncEtcd([("e1", 2379), ("e2", 2379)], timeout_s=60.0)   # a member's own wait: far longer
    etcd._clients = [hanging, answering]
    el.etcd = etcd
    el.attempt_s = 0.05                 # the renewal's bound, in real time here
    clock.advance(el.renew_s)
    async with asyncio.timeout(5):      # the test's own guard: without the bound it would hang
        with pytest.raises(EtcdUnavailable, match="no answer to a lease renewal"):
            await el._step()
    assert el.role.state == HAState.ACTIVE and len(hanging.sent) == 1
    assert el._interval() == pytest.approx(el.retry_s)
    clock.advance(el._interval())
    await el._step()                    # the retry starts at the other member
    assert answering.sent == [clock()] and el.role.renewed_at == clock()
