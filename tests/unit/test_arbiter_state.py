"""The Harmony arbiter's pure rules: one CPU slot, primary + yielding secondary network slots,
arrival order across jobs, reclaim on disconnect, the grant log."""
from __future__ import annotations

import pytest

from nodemanager.arbiter import (TRANSITIONS, Arbiter, ArbiterError, GrantRecord, RequestEvent,
                                 RequestState, cpu_oversubscribed, overlapping_cpu_grants)
from protocol.arbiter_wire import YIELDING, Op, Role, SlotKind

CPU, COMM = SlotKind.CPU, SlotKind.COMM
JOB_A, JOB_B, JOB_C = 0xA, 0xB, 0xC


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def arbiter() -> Arbiter:
    return Arbiter(clock=Clock())


def grants(notices: list) -> list[tuple[int, int, Role]]:
    """(conn, request id, role) of the GRANT notices."""
    return [(n.conn, n.frame.request_id, Role(n.frame.kind)) for n in notices if n.frame.op == Op.GRANT]


def ops(notices: list) -> list[tuple[int, Op, int]]:
    return [(n.conn, Op(n.frame.op), n.frame.flags) for n in notices]


def test_one_cpu_slot_granted_in_arrival_order_across_jobs() -> None:
    a = arbiter()
    assert grants(a.acquire(1, 1, CPU, JOB_A, 11)) == [(1, 1, Role.CPU)]
    # B, then A again, then C wait behind the holder, in the order they asked.
    assert a.acquire(2, 1, CPU, JOB_B, 22) == []
    assert a.acquire(1, 2, CPU, JOB_A, 11) == []
    assert a.acquire(3, 1, CPU, JOB_C, 33) == []
    assert a.waiting(CPU) == 3
    assert grants(a.release(1, 1)) == [(2, 1, Role.CPU)]
    assert grants(a.release(2, 1)) == [(1, 2, Role.CPU)]
    assert grants(a.release(1, 2)) == [(3, 1, Role.CPU)]
    assert a.release(3, 1) == [] and a.cpu_in_use == 0
    assert [r.job for r in a.records()] == [JOB_A, JOB_B, JOB_A, JOB_C]
    assert overlapping_cpu_grants(a.records()) == []


def test_a_cpu_pool_runs_comps_side_by_side_while_their_threads_fit() -> None:
    a = Arbiter(clock=Clock(), cpu_pool=4)
    assert ops(a.acquire(1, 1, CPU, JOB_A, 11, threads=2)) == [(1, Op.GRANT, 2)]     # flags: threads granted
    assert ops(a.acquire(2, 1, CPU, JOB_B, 22, threads=2)) == [(2, Op.GRANT, 2)]
    assert a.cpu_in_use == 4
    assert a.acquire(3, 1, CPU, JOB_C, 33, threads=1) == []          # the pool is full
    assert grants(a.release(1, 1)) == [(3, 1, Role.CPU)]
    assert a.cpu_in_use == 3 and [r.job for r in a.cpu_holders] == [JOB_B, JOB_C]
    assert cpu_oversubscribed(a.records(), 4) == []


def test_no_small_comp_overtakes_a_large_one_waiting_at_the_head() -> None:
    a = Arbiter(clock=Clock(), cpu_pool=4)
    a.acquire(1, 1, CPU, JOB_A, 11, threads=3)
    assert a.acquire(2, 1, CPU, JOB_B, 22, threads=2) == []         # 3 + 2 > 4: waits
    assert a.acquire(3, 1, CPU, JOB_C, 33, threads=1) == []         # would fit, but B asked first
    assert grants(a.release(1, 1)) == [(2, 1, Role.CPU), (3, 1, Role.CPU)]
    assert a.cpu_in_use == 3


def test_a_comp_asking_for_more_than_the_pool_holds_the_whole_pool() -> None:
    a = Arbiter(clock=Clock(), cpu_pool=2)
    assert ops(a.acquire(1, 1, CPU, JOB_A, 11, threads=8)) == [(1, Op.GRANT, 2)]
    assert a.acquire(2, 1, CPU, JOB_B, 22, threads=1) == []
    assert ops(a.acquire(3, 1, CPU, JOB_C, 33, threads=0)) == []    # 0: an older client's 1 thread
    assert [r.threads for r in a.records()] == [2]
    with pytest.raises(ArbiterError, match="cpu_pool must be >= 1"):
        Arbiter(cpu_pool=0)
    with pytest.raises(ArbiterError, match="asks for -1 threads"):
        a.acquire(4, 1, CPU, JOB_C, 44, threads=-1)


def test_oversubscription_check_finds_more_threads_than_the_pool_at_once() -> None:
    def rec(job: int, t0: float, t1: float | None, threads: int) -> GrantRecord:
        return GrantRecord("cpu", job, job, 1, t0, t0, released_at=t1, threads=threads)
    ok = [rec(JOB_A, 0, 2, 2), rec(JOB_B, 1, 3, 2), rec(JOB_C, 2, None, 2)]     # C starts as A ends
    assert cpu_oversubscribed(ok, 4) == []
    bad = ok + [rec(JOB_A, 2.5, 4, 1)]
    assert cpu_oversubscribed(bad, 4) == [(2.5, 5)]
    assert cpu_oversubscribed(ok, 3) == [(1, 4), (2, 4)]


def test_cpu_and_network_slots_are_independent() -> None:
    a = arbiter()
    assert grants(a.acquire(1, 1, CPU, JOB_A, 1)) == [(1, 1, Role.CPU)]
    # A network subtask of another job runs beside the COMP.
    assert grants(a.acquire(2, 1, COMM, JOB_B, 2)) == [(2, 1, Role.PRIMARY)]
    assert a.held_by(1) == [(1, Role.CPU)] and a.held_by(2) == [(1, Role.PRIMARY)]


def test_second_network_subtask_is_the_secondary_and_yields_while_the_primary_is_busy() -> None:
    a = arbiter()
    a.acquire(1, 1, COMM, JOB_A, 1)
    # The primary transfers from its grant on: the secondary starts out yielding.
    n = a.acquire(2, 1, COMM, JOB_B, 2)
    assert grants(n) == [(2, 1, Role.SECONDARY)] and n[0].frame.flags == YIELDING
    # The primary's requests are out, it waits on servers: the secondary goes on.
    assert ops(a.set_busy(1, 1, False)) == [(2, Op.YIELD, 0)]
    # Idle again is no news.
    assert a.set_busy(1, 1, False) == []
    # The primary transfers again (replies, or another round): the secondary yields.
    assert ops(a.set_busy(1, 1, True)) == [(2, Op.YIELD, YIELDING)]
    # A third one waits: two network slots only.
    assert a.acquire(3, 1, COMM, JOB_C, 3) == [] and a.waiting(COMM) == 1


def test_secondary_that_starts_while_the_primary_is_idle_does_not_yield() -> None:
    a = arbiter()
    a.acquire(1, 1, COMM, JOB_A, 1)
    a.set_busy(1, 1, False)
    n = a.acquire(2, 1, COMM, JOB_B, 2)
    assert grants(n) == [(2, 1, Role.SECONDARY)] and n[0].frame.flags == 0


def test_primary_leaving_promotes_the_secondary_and_the_next_one_becomes_secondary() -> None:
    a = arbiter()
    a.acquire(1, 1, COMM, JOB_A, 1)
    a.acquire(2, 1, COMM, JOB_B, 2)
    a.acquire(3, 1, COMM, JOB_C, 3)
    n = a.release(1, 1)
    assert ops(n) == [(2, Op.PROMOTE, 0), (3, Op.GRANT, YIELDING)]
    assert a.primary is not None and a.primary.conn == 2 and a.primary.state is RequestState.PRIMARY
    assert a.secondary is not None and a.secondary.conn == 3
    rec_b = [r for r in a.records() if r.job == JOB_B][0]
    assert rec_b.role == "secondary" and rec_b.promoted_at is not None
    # The secondary leaving first leaves the primary alone; the queue is empty.
    assert a.release(3, 1) == [] and a.secondary is None
    assert a.release(2, 1) == [] and a.primary is None


def test_a_closed_connection_gives_back_what_it_held_and_withdraws_what_it_waited_for() -> None:
    a = arbiter()
    a.acquire(1, 1, CPU, JOB_A, 1)
    a.acquire(1, 2, COMM, JOB_A, 1)      # pipelined: the same executor's network subtask
    a.acquire(2, 1, CPU, JOB_B, 2)
    a.acquire(2, 2, COMM, JOB_B, 2)      # secondary
    a.acquire(1, 3, CPU, JOB_A, 1)       # queued behind B
    a.acquire(3, 1, COMM, JOB_C, 3)      # queued
    n = a.disconnect(1)
    assert ops(n) == [(2, Op.GRANT, 1), (2, Op.PROMOTE, 0), (3, Op.GRANT, YIELDING)]   # CPU: 1 thread
    assert a.held_by(1) == [] and a.waiting(CPU) == 0 and a.waiting(COMM) == 0
    assert a.held_by(2) == [(1, Role.CPU), (2, Role.PRIMARY)]
    reclaimed = [r for r in a.records() if r.reclaimed]
    assert {(r.role, r.job) for r in reclaimed} == {("cpu", JOB_A), ("primary", JOB_A)}
    # Nothing of connection 1 is left to release.
    with pytest.raises(ArbiterError):
        a.release(1, 3)


def test_a_queued_request_can_be_withdrawn() -> None:
    a = arbiter()
    a.acquire(1, 1, CPU, JOB_A, 1)
    a.acquire(2, 1, CPU, JOB_B, 2)
    a.acquire(3, 1, CPU, JOB_C, 3)
    assert a.release(2, 1) == []             # B gives up waiting
    assert grants(a.release(1, 1)) == [(3, 1, Role.CPU)]
    assert [r.job for r in a.records()] == [JOB_A, JOB_C]


def test_errors_name_the_request() -> None:
    a = arbiter()
    a.acquire(1, 7, CPU, JOB_A, 1)
    with pytest.raises(ArbiterError, match="request 7 .* already known"):
        a.acquire(1, 7, COMM, JOB_A, 1)
    with pytest.raises(ArbiterError, match="request 8"):
        a.release(1, 8)
    with pytest.raises(ArbiterError, match="no network slot"):
        a.set_busy(1, 7, False)
    # The same request id on another connection is another request.
    assert a.acquire(2, 7, CPU, JOB_B, 2) == []


def test_transition_table_refuses_what_cannot_happen() -> None:
    assert TRANSITIONS.next(RequestState.SECONDARY, RequestEvent.PROMOTE) is RequestState.PRIMARY
    with pytest.raises(ArbiterError, match="promote not allowed for a request that is cpu"):
        TRANSITIONS.next(RequestState.CPU, RequestEvent.PROMOTE)
    with pytest.raises(ArbiterError):
        TRANSITIONS.next(RequestState.DONE, RequestEvent.RELEASE)


def test_fairness_a_busy_job_cannot_starve_another() -> None:
    """Job A re-asks at once after every release; B asked once while A held: B is next."""
    a = arbiter()
    a.acquire(1, 0, CPU, JOB_A, 1)
    a.acquire(2, 0, CPU, JOB_B, 2)
    a.release(1, 0)
    a.acquire(1, 1, CPU, JOB_A, 1)
    assert [r.job for r in a.cpu_holders] == [JOB_B]
    a.release(2, 0)
    assert [r.job for r in a.cpu_holders] == [JOB_A]


def test_grant_log_is_bounded_and_records_times() -> None:
    a = Arbiter(clock=Clock(), log_size=3)
    for i in range(5):
        a.acquire(1, i, CPU, JOB_A, 1)
        a.release(1, i)
    recs = a.records()
    assert len(recs) == 3 and [r.request_id for r in recs] == [2, 3, 4]
    assert all(r.asked_at <= r.granted_at < (r.released_at or 0) for r in recs)
    assert a.grants == 5
    assert recs[0].to_json()["job"] == f"{JOB_A:016x}"


def test_counters_outlive_the_bounded_log() -> None:
    a = Arbiter(clock=Clock(), log_size=2)
    # A, B, C one after another is no interleaving; A coming back after C is one, B after A another.
    for i, job in enumerate([JOB_A, JOB_A, JOB_B, JOB_C, JOB_A, JOB_B]):
        a.acquire(1, i, CPU, job, 1)
        a.release(1, i)
    a.acquire(1, 99, COMM, JOB_C, 1)            # network grants count for neither
    assert len(a.records()) == 2
    assert a.cpu_grants_by_job == {JOB_A: 3, JOB_B: 2, JOB_C: 1}
    assert a.cpu_interleavings == 2
    st = a.state()
    assert st["cpu_interleavings"] == 2 and st["cpu_grants_by_job"] == {f"{JOB_A:016x}": 3, f"{JOB_B:016x}": 2,
                                                                        f"{JOB_C:016x}": 1}


def test_overlap_check_finds_overlapping_comp_of_different_jobs() -> None:
    ok = [GrantRecord("cpu", JOB_A, 1, 1, 0, 0, 2), GrantRecord("cpu", JOB_B, 2, 1, 0, 2, 3)]
    assert overlapping_cpu_grants(ok) == []
    bad = ok + [GrantRecord("cpu", JOB_C, 3, 1, 0, 2.5, None)]
    assert [(x.job, y.job) for x, y in overlapping_cpu_grants(bad)] == [(JOB_B, JOB_C)]
    # Network grants may overlap.
    assert overlapping_cpu_grants([GrantRecord("primary", JOB_A, 1, 1, 0, 0, 5),
                                   GrantRecord("secondary", JOB_B, 2, 1, 0, 1, 4)]) == []
