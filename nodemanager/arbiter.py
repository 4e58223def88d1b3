"""The Harmony arbiter's rules: which subtask of which executor may use the node's CPU or network.

Pure (no I/O, an injected clock); `arbiter_server.py` puts it behind the NM's unix socket. Per node
(dissertation §4.3.1; docs/harmony_arbiter.md, "Slots and rules"):

- **CPU**: a pool of the host's cores (`cpu_pool`, the NM's `arbiter_cpu_pool`: by default the
  cores its cgroup root allows). A COMP asks for the threads it will use (its job's `comp_threads`)
  and holds that many cores; COMPs run side by side while their threads fit, and the sum of the
  threads held never exceeds the pool. The paper's setting -- a COMP uses all of a machine's cores,
  so one runs at a time -- is the case threads == pool; a request for more than the pool is granted
  the whole pool (it cannot run faster than the host, and must not wait forever).
- **Network**: a primary and a secondary slot. One network subtask leaves the network idle while
  servers handle its requests, so a second one runs beside it, as the secondary, which *yields* to
  the primary: while the primary transfers (it is busy from its grant until its holder says IDLE --
  its requests are written and it only waits on servers -- or BUSY again) the secondary is told
  YIELD and sends nothing more; when the primary goes idle it is told to go on. When the primary
  slot is released the secondary is promoted to primary (it yields no more) and the next waiting
  network subtask becomes the secondary.
- Each kind's waiting requests form one queue in arrival order, across jobs: no job can overtake
  another's earlier request (a small COMP that would fit waits behind a large one at the head).
- A connection's requests, held or waiting, are reclaimed when it closes (a crashed executor), so
  its slots pass on at once.

Every request goes through the `TRANSITIONS` table (QUEUED -> CPU / PRIMARY / SECONDARY -> DONE,
SECONDARY -> PRIMARY on promotion). Every grant is recorded in a bounded log (`GrantRecord`: role,
job, executor, when asked, granted, released), which the NM serves so a test can check that COMP
subtasks never held more cores than the pool (`cpu_oversubscribed`). The log is bounded, so cumulative counters sit beside
it: CPU grants per job and `cpu_interleavings` (CPU grants to a job that had the slot before, with
another job's grant in between -- the COMP interleaving Harmony is for), which a long run cannot
push out.
"""
from __future__ import annotations

import collections
import enum
import time
from dataclasses import dataclass
from typing import Callable, Deque, NamedTuple, Optional

from protocol.arbiter_wire import YIELDING, Frame, Op, Role, SlotKind
from protocol.state_machine import TransitionTable
from protocol.errors import ProtocolError

DEFAULT_LOG_SIZE = 20000


class ArbiterError(ProtocolError, ValueError):
    """A request the arbiter's rules refuse (unknown request id, a request id used twice, ...)."""


class RequestState(enum.Enum):
    QUEUED = "queued"
    CPU = "cpu"
    PRIMARY = "primary"
    SECONDARY = "secondary"
    DONE = "done"


class RequestEvent(enum.Enum):
    GRANT_CPU = "grant_cpu"
    GRANT_PRIMARY = "grant_primary"
    GRANT_SECONDARY = "grant_secondary"
    PROMOTE = "promote"        # the primary left: the secondary takes its place
    RELEASE = "release"        # given back by its holder (or cancelled while queued)
    RECLAIM = "reclaim"        # its connection closed


S, E = RequestState, RequestEvent
TRANSITIONS: TransitionTable[RequestState, RequestEvent, RequestState] = TransitionTable({
    (S.QUEUED, E.GRANT_CPU): S.CPU,
    (S.QUEUED, E.GRANT_PRIMARY): S.PRIMARY,
    (S.QUEUED, E.GRANT_SECONDARY): S.SECONDARY,
    (S.QUEUED, E.RELEASE): S.DONE,
    (S.QUEUED, E.RECLAIM): S.DONE,
    (S.CPU, E.RELEASE): S.DONE,
    (S.CPU, E.RECLAIM): S.DONE,
    (S.PRIMARY, E.RELEASE): S.DONE,
    (S.PRIMARY, E.RECLAIM): S.DONE,
    (S.SECONDARY, E.PROMOTE): S.PRIMARY,
    (S.SECONDARY, E.RELEASE): S.DONE,
    (S.SECONDARY, E.RECLAIM): S.DONE,
}, lambda s, e: ArbiterError(f"{e.value} not allowed for a request that is {s.value}"))

_ROLE_OF = {S.CPU: Role.CPU, S.PRIMARY: Role.PRIMARY, S.SECONDARY: Role.SECONDARY}
_ROLE_NAME = {S.CPU: "cpu", S.PRIMARY: "primary", S.SECONDARY: "secondary"}


class Notice(NamedTuple):
    """A frame the server must send to connection `conn`."""

    conn: int
    frame: Frame


@dataclass(slots=True)
class GrantRecord:
    """One grant in the log: times on the arbiter's clock (the NM's: wall-clock seconds, so they
    line up with other nodes' logs and accounting); `released_at` None while held."""

    role: str                  # "cpu" | "primary" | "secondary" (as granted)
    job: int
    executor: int
    request_id: int
    asked_at: float
    granted_at: float
    released_at: Optional[float] = None
    promoted_at: Optional[float] = None
    reclaimed: bool = False
    threads: int = 1           # cores a CPU grant holds (1 for network grants)

    def to_json(self) -> dict[str, object]:
        return {"role": self.role, "job": f"{self.job:016x}", "executor": f"{self.executor:016x}",
                "request_id": self.request_id, "asked_at": self.asked_at, "granted_at": self.granted_at,
                "released_at": self.released_at, "promoted_at": self.promoted_at,
                "reclaimed": self.reclaimed, "threads": self.threads}


@dataclass(slots=True)
class _Request:
    conn: int
    request_id: int
    kind: SlotKind
    job: int
    executor: int
    asked_at: float
    threads: int = 1                # cores a CPU request asks for (clamped to the pool)
    state: RequestState = RequestState.QUEUED
    busy: bool = True               # a network holder transfers until it says IDLE
    yielding: bool = False          # what the secondary was last told
    record: Optional[GrantRecord] = None

    def frame(self, op: Op, kind: int = 0, flags: int = 0) -> Notice:
        return Notice(self.conn, Frame(op, kind, flags, self.request_id, self.job, self.executor))


class Arbiter:
    """One node's slots, queues and grant log. Every event returns the notices to send."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, log_size: int = DEFAULT_LOG_SIZE,
                 cpu_pool: int = 1) -> None:
        if cpu_pool < 1:
            raise ArbiterError(f"cpu_pool must be >= 1 core, got {cpu_pool}")
        self._clock = clock
        self._requests: dict[tuple[int, int], _Request] = {}
        self._queues: dict[SlotKind, Deque[_Request]] = {k: collections.deque() for k in SlotKind}
        self.cpu_pool = cpu_pool
        self.cpu_holders: list[_Request] = []      # COMPs holding cores, in grant order
        self.cpu_in_use = 0                         # the sum of their threads (<= cpu_pool)
        self.primary: Optional[_Request] = None
        self.secondary: Optional[_Request] = None
        self.log: Deque[GrantRecord] = collections.deque(maxlen=log_size)
        self.grants = 0
        self.cpu_grants_by_job: collections.Counter[int] = collections.Counter()
        self.cpu_interleavings = 0
        self._last_cpu_job: Optional[int] = None

    # -- events ------------------------------------------------------------------------------
    def acquire(self, conn: int, request_id: int, kind: SlotKind, job: int, executor: int,
                threads: int = 1) -> list[Notice]:
        """A subtask asks for a slot of `kind` (a COMP: `threads` of the pool's cores): granted now
        if it is free and nobody waits before it, else queued in arrival order."""
        key = (conn, request_id)
        if key in self._requests:
            raise ArbiterError(f"request {request_id} of connection {conn} is already known")
        if threads < 0:
            raise ArbiterError(f"request {request_id} of connection {conn} asks for {threads} threads")
        kind = SlotKind(kind)
        # 0 is an older client's "unsaid": one thread. More than the pool gets the whole pool.
        n = min(max(1, threads), self.cpu_pool) if kind is SlotKind.CPU else 1
        req = _Request(conn, request_id, kind, job, executor, self._clock(), n)
        self._requests[key] = req
        self._queues[req.kind].append(req)
        return self._dispatch()

    def release(self, conn: int, request_id: int) -> list[Notice]:
        """The holder gives its slot back (or a waiting request is withdrawn)."""
        req = self._requests.get((conn, request_id))
        if req is None:
            raise ArbiterError(f"request {request_id} of connection {conn} holds and waits for nothing")
        self._end(req, RequestEvent.RELEASE)
        return self._dispatch()

    def set_busy(self, conn: int, request_id: int, busy: bool) -> list[Notice]:
        """A network holder says whether it is transferring (BUSY) or only waiting on servers (IDLE);
        a secondary yields while the primary is busy."""
        req = self._requests.get((conn, request_id))
        if req is None or req.kind is not SlotKind.COMM:
            raise ArbiterError(f"request {request_id} of connection {conn} holds no network slot")
        req.busy = busy
        return self._dispatch()

    def disconnect(self, conn: int) -> list[Notice]:
        """Reclaim everything connection `conn` held or waited for (its executor is gone)."""
        for req in [r for r in self._requests.values() if r.conn == conn]:
            self._end(req, RequestEvent.RECLAIM)
        return self._dispatch()

    # -- queries -----------------------------------------------------------------------------
    def waiting(self, kind: SlotKind) -> int:
        return len(self._queues[kind])

    def held_by(self, conn: int) -> list[tuple[int, Role]]:
        """(request id, role) of the slots connection `conn` holds."""
        return [(r.request_id, _ROLE_OF[r.state]) for r in (*self.cpu_holders, self.primary, self.secondary)
                if r is not None and r.conn == conn]

    def records(self) -> list[GrantRecord]:
        return list(self.log)

    def state(self) -> dict[str, object]:
        """Holders and queue lengths (for the NM web API)."""
        def who(r: Optional[_Request]) -> Optional[dict[str, object]]:
            return None if r is None else {"job": f"{r.job:016x}", "executor": f"{r.executor:016x}",
                                           "request_id": r.request_id}
        return {"cpu": [{**(who(r) or {}), "threads": r.threads} for r in self.cpu_holders],
                "cpu_pool": self.cpu_pool, "cpu_in_use": self.cpu_in_use,
                "primary": who(self.primary), "secondary": who(self.secondary),
                "cpu_waiting": self.waiting(SlotKind.CPU), "comm_waiting": self.waiting(SlotKind.COMM),
                "grants": self.grants, "cpu_interleavings": self.cpu_interleavings,
                "cpu_grants_by_job": {f"{j:016x}": n for j, n in self.cpu_grants_by_job.items()}}

    # -- internals ---------------------------------------------------------------------------
    def _end(self, req: _Request, event: RequestEvent) -> None:
        was = req.state
        req.state = TRANSITIONS.next(was, event)
        del self._requests[(req.conn, req.request_id)]
        if was is RequestState.QUEUED:
            self._queues[req.kind].remove(req)
            return
        if req.record is not None:
            req.record.released_at = self._clock()
            req.record.reclaimed = event is RequestEvent.RECLAIM
        if req.kind is SlotKind.CPU:
            self.cpu_holders.remove(req)
            self.cpu_in_use -= req.threads
        elif req is self.primary:
            self.primary = None
        elif req is self.secondary:
            self.secondary = None

    def _grant(self, req: _Request, event: RequestEvent, flags: int = 0) -> Notice:
        state = req.state = TRANSITIONS.next(req.state, event)
        req.record = GrantRecord(_ROLE_NAME[state], req.job, req.executor, req.request_id, req.asked_at,
                                 self._clock(), threads=req.threads)
        self.log.append(req.record)
        self.grants += 1
        if state is RequestState.CPU:
            if req.job != self._last_cpu_job and self.cpu_grants_by_job[req.job] > 0:
                self.cpu_interleavings += 1
            self.cpu_grants_by_job[req.job] += 1
            self._last_cpu_job = req.job
        return req.frame(Op.GRANT, _ROLE_OF[state], req.threads if state is RequestState.CPU else flags)

    def _dispatch(self) -> list[Notice]:
        """Fill free slots from the queues' heads and tell the secondary whether to yield."""
        out: list[Notice] = []
        cpu_q, comm_q = self._queues[SlotKind.CPU], self._queues[SlotKind.COMM]
        # The head of the CPU queue goes first; nothing behind it overtakes it, even if it would fit.
        while cpu_q and self.cpu_in_use + cpu_q[0].threads <= self.cpu_pool:
            req = cpu_q.popleft()
            self.cpu_holders.append(req)
            self.cpu_in_use += req.threads
            out.append(self._grant(req, RequestEvent.GRANT_CPU))
        if self.primary is None and self.secondary is not None:
            self.primary, self.secondary = self.secondary, None
            self.primary.state = TRANSITIONS.next(self.primary.state, RequestEvent.PROMOTE)
            self.primary.yielding = False
            if self.primary.record is not None:
                self.primary.record.promoted_at = self._clock()
            out.append(self.primary.frame(Op.PROMOTE, Role.PRIMARY))
        if self.primary is None and comm_q:
            self.primary = comm_q.popleft()
            self.primary.busy = True
            out.append(self._grant(self.primary, RequestEvent.GRANT_PRIMARY))
        should_yield = self.primary is not None and self.primary.busy
        if self.secondary is None and comm_q:
            self.secondary = comm_q.popleft()
            self.secondary.busy = True
            self.secondary.yielding = should_yield
            out.append(self._grant(self.secondary, RequestEvent.GRANT_SECONDARY, YIELDING if should_yield else 0))
        elif self.secondary is not None and self.secondary.yielding != should_yield:
            self.secondary.yielding = should_yield
            out.append(self.secondary.frame(Op.YIELD, Role.SECONDARY, YIELDING if should_yield else 0))
        return out


def cpu_oversubscribed(records: list[GrantRecord], pool: int) -> list[tuple[float, int]]:
    """(time, threads held) at every CPU grant after which the grants held at once -- each
    [granted, released), a held one until now -- hold more than `pool` cores: what the arbiter must
    never let happen. Empty when the invariant held over the log."""
    events: list[tuple[float, int, int]] = []     # (time, 0 = release first / 1 = grant, +-threads)
    for r in records:
        if r.role == "cpu":
            events.append((r.granted_at, 1, r.threads))
            if r.released_at is not None:
                events.append((r.released_at, 0, -r.threads))
    out, held = [], 0
    for t, _, d in sorted(events):
        held += d
        if d > 0 and held > pool:
            out.append((t, held))
    return out


def overlapping_cpu_grants(records: list[GrantRecord]) -> list[tuple[GrantRecord, GrantRecord]]:
    """Pairs of CPU grants of different jobs whose [granted, released) intervals overlap (a held
    grant counts as running until now): with a one-core pool (or COMPs that each ask for the whole
    pool) what the arbiter must never let happen; with a larger pool, see `cpu_oversubscribed`."""
    cpu = sorted((r for r in records if r.role == "cpu"), key=lambda r: r.granted_at)
    out = []
    for i, a in enumerate(cpu):
        end = a.released_at if a.released_at is not None else float("inf")
        for b in cpu[i + 1:]:
            if b.granted_at >= end:
                break
            if b.job != a.job:
                out.append((a, b))
    return out
