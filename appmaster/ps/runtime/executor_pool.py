"""The PS job's executors: which container runs which executor in which role, where it listens,
and what it reports (RSS, data and model bytes, blocks).

Executors are launched with `python -m psruntime.executor ... --am HOST:PORT` and announce their
data-plane address to the AM's small data-plane server with an "executor_ready" frame
(protocol.executor_ops.ExecutorReady, decoded once by `handle_frame`); `wait_ready` waits for a
role's executors with a deadline.

The pool is where the AM learns that an executor is gone, and the one place that says so: its
container's completion (`mark_exited`: it died, was killed, or its node was lost, as the RM
reports), or the AM giving up on it (`declare_lost`: no reply by a deadline). Either way the AM's
data-plane client (`links`) marks its address lost, so every request in flight to it fails at once
(psruntime.wire.dataplane.PeerLost; appmaster.ps.runtime.executor_rpc.ExecutorLost), and `watch_losses` wakes
whoever waits on work that needs it (the clock loop, on a server).
"""
from __future__ import annotations

import asyncio
import enum
import shlex
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

import msgspec

from appmaster.container_book import AmContainer
from protocol import container_env
from protocol import executor_ops as ops
from protocol.internal_api import LaunchContext, NodePlacement, WarmStart, counts_on_nodes
from protocol.local_resources import LocalResource
from protocol.ps_status import ExecutorStatus, ShapeStatus
from protocol.records import ExitStatus
from protocol.state_machine import InvalidTransition, TransitionTable
from psruntime.wire.dataplane import DataPlaneClient, Reply, RequestError
from psruntime.wire.frame_codec import Frame

EXECUTOR_MODULE = "psruntime.executor"


class Role(str, enum.Enum):
    SERVER = "server"
    WORKER = "worker"


class ExecutorState(str, enum.Enum):
    """Where one executor of the job is, as the AM sees it."""

    LAUNCHING = "LAUNCHING"     # container launched, executor not announced yet
    READY = "READY"             # announced its data-plane address
    RETIRING = "RETIRING"       # removed from the job by an elastic change; its container is stopping
    EXITED = "EXITED"           # its container completed


class ExecutorEvent(str, enum.Enum):
    """What happens to an executor: it announces itself, is retired, or its container completes."""

    ANNOUNCE = "ANNOUNCE"
    RETIRE = "RETIRE"
    EXIT = "EXIT"


class ExecutorStateError(InvalidTransition):
    """An event the executor's state does not take (an AM bug)."""

    def __init__(self, state: ExecutorState, event: ExecutorEvent):
        super().__init__(f"executor: {event.value} not allowed in state {state.value}", state, event)


_X, _XE = ExecutorState, ExecutorEvent
# Retiring again is a no-op (a change may retire what an earlier one did); a completion comes once
# per container, but the RM may repeat it, so EXITED takes EXIT too.
EXECUTOR_TRANSITIONS: TransitionTable[ExecutorState, ExecutorEvent, ExecutorState] = TransitionTable({
    (_X.LAUNCHING, _XE.ANNOUNCE): _X.READY,
    **{(s, _XE.RETIRE): _X.RETIRING for s in (_X.LAUNCHING, _X.READY, _X.RETIRING)},
    **{(s, _XE.EXIT): _X.EXITED for s in ExecutorState},
}, ExecutorStateError)


@dataclass
class ExecutorRecord:
    """One executor as the AM knows it."""

    executor_id: str
    role: Role
    container: AmContainer
    state: ExecutorState = ExecutorState.LAUNCHING
    address: str = ""
    pid: Optional[int] = None
    rss_bytes: int = 0
    data_bytes: int = 0          # a worker's input partition (data + local state)
    model_bytes: int = 0         # a server's model blocks
    blocks: list[int] = field(default_factory=list)   # model blocks (server) / input blocks (worker)
    partition: Optional[int] = None
    spill_alpha: Optional[float] = None   # a spilling worker's disk block ratio (Harmony §4.3.3)
    spilled_bytes: int = 0               # bytes of its spill files
    spill_stall_s: float = 0.0           # its load stall seconds so far
    allocated_at: float = field(default_factory=time.monotonic)   # its container arrived
    ready_at: float = 0.0                # it announced itself (monotonic; 0 = not yet)

    def on(self, event: ExecutorEvent) -> None:
        """Take `event` through EXECUTOR_TRANSITIONS (ExecutorStateError if not allowed)."""
        self.state = EXECUTOR_TRANSITIONS.next(self.state, event)

    @property
    def container_id(self) -> str:
        return self.container.container_id

    def describe_exit(self, memory_mb: int) -> str:
        """Why this executor's container ended, for the job's diagnostics."""
        c = self.container
        code = c.exit_status
        text = (f"{self.executor_id} ({self.role.value}, {c.container_id} on {c.node_id}) exited with {code} "
                f"({ExitStatus.describe(code)})")
        if code == ExitStatus.KILLED_EXCEEDED_PMEM:
            text += f": over its {memory_mb} MB limit"
        if c.diagnostics:
            text += f"; {c.diagnostics.strip()}"
        return text

    def status(self) -> ExecutorStatus:
        """This executor as the job's status shows it (`/status` "shape" "executors")."""
        mb = 1024 * 1024
        return ExecutorStatus(id=self.executor_id, role=self.role.value, container_id=self.container_id,
                              node=self.container.node_id, state=self.state.value, address=self.address,
                              pid=self.pid, rss_mb=round(self.rss_bytes / mb, 1),
                              data_mb=round(self.data_bytes / mb, 3), model_mb=round(self.model_bytes / mb, 3),
                              blocks=list(self.blocks), partition=self.partition, spill_alpha=self.spill_alpha,
                              spilled_mb=round(self.spilled_bytes / mb, 3),
                              spill_stall_s=round(self.spill_stall_s, 3))


def executor_index(rec: ExecutorRecord) -> int:
    """The number in an executor's id (`worker-3` -> 3): launch order within its role."""
    return int(rec.executor_id.rsplit("-", 1)[1])


def by_index(recs: Iterable[ExecutorRecord]) -> list[ExecutorRecord]:
    return sorted(recs, key=executor_index)


class ExecutorPool:
    """Every executor of the job, by id and by container."""

    def __init__(self, num_blocks: int, am_address: str = "", python: str = "python",
                 job_secret: str = "", use_arbiter: bool = False, links: Optional[DataPlaneClient] = None,
                 resources: Optional[Mapping[str, LocalResource]] = None) -> None:
        self.num_blocks = num_blocks
        # The job spec's `resources` (a user app's code and files): localized into every executor's
        # working dir, which the app loader puts on sys.path (psruntime.apps.registry).
        self.local_resources = {name: msgspec.to_builtins(r) for name, r in (resources or {}).items()}
        self.am_address = am_address          # set once the AM's data-plane server listens
        self.python = python
        self.job_secret = job_secret          # handed to every executor in its environment
        # Harmony's co-location group of the job (the last applied ShapeDirective's; None: not grouped):
        # executors launched while it is set take their node's arbiter slots and weighted CPU.
        self.harmony_group: Optional[str] = None
        self.use_arbiter = use_arbiter        # the job spec's `use_arbiter`: slots with no group too
        self.executors: dict[str, ExecutorRecord] = {}
        self._by_container: dict[str, ExecutorRecord] = {}
        self._next_index = {Role.SERVER: 0, Role.WORKER: 0}
        self._changed = asyncio.Event()
        self.links = links                    # the AM's data-plane client: lost addresses fail there
        self.lost: dict[str, str] = {}        # executor id -> why it was lost (not retired on purpose)
        self._loss_watches: list[tuple[frozenset[str], asyncio.Future[ExecutorRecord]]] = []

    # -- bookkeeping -------------------------------------------------------------------------
    def add(self, role: Role, container: AmContainer) -> ExecutorRecord:
        """Name the executor that `container` will run (server-0, server-1, worker-0 ...)."""
        i = self._next_index[role]
        self._next_index[role] = i + 1
        rec = ExecutorRecord(f"{role.value}-{i}", role, container)
        self.executors[rec.executor_id] = rec
        self._by_container[container.container_id] = rec
        return rec

    def adopt(self, executor_id: str, role: Role, container: AmContainer, address: str) -> ExecutorRecord:
        """An executor a failed attempt started and this one takes over (appmaster.ps.attempt_takeover):
        READY at `address` under its old name; names given from now on come after it."""
        if executor_id in self.executors:
            raise ExecutorStateError(ExecutorState.READY, ExecutorEvent.ANNOUNCE)
        rec = ExecutorRecord(executor_id, role, container, state=ExecutorState.READY, address=address,
                             ready_at=time.monotonic())
        self.executors[executor_id] = rec
        self._by_container[container.container_id] = rec
        self._next_index[role] = max(self._next_index[role], executor_index(rec) + 1)
        if self.links is not None:
            self.links.clear_lost(address)
        self._changed.set()
        return rec

    def by_container(self, container_id: str) -> Optional[ExecutorRecord]:
        return self._by_container.get(container_id)

    def by_address(self, address: str) -> Optional[ExecutorRecord]:
        """The executor announced at data-plane `address` (the latest one, if a port was reused)."""
        found = [e for e in self.executors.values() if e.address == address]
        return found[-1] if found else None

    def of_role(self, role: Role, state: Optional[ExecutorState] = None) -> list[ExecutorRecord]:
        return [e for e in self.executors.values() if e.role is role and (state is None or e.state is state)]

    @property
    def servers(self) -> list[ExecutorRecord]:
        return self.of_role(Role.SERVER)

    @property
    def workers(self) -> list[ExecutorRecord]:
        return self.of_role(Role.WORKER)

    def ready(self, role: Role) -> list[ExecutorRecord]:
        """The READY executors of `role`, in launch order."""
        return by_index(self.of_role(role, ExecutorState.READY))

    def live(self) -> list[ExecutorRecord]:
        return [e for e in self.executors.values() if e.state is not ExecutorState.EXITED]

    def all_on(self, nodes: tuple[str, ...]) -> bool:
        """Whether every live executor runs on one of `nodes` (a placement directive's)."""
        return all(e.container.node_id in nodes for e in self.live())

    def placed(self, nodes: tuple[str, ...], placement: Sequence[NodePlacement] = ()) -> bool:
        """Whether the job's executors are where a directive puts them: with a per-node
        `placement`, exactly its workers and servers on each of its nodes and none elsewhere
        (launching or serving ones); else every live executor on `nodes` (none: anywhere)."""
        if not placement:
            return not nodes or self.all_on(nodes)
        have: dict[tuple[str, Role], int] = {}
        for e in self.executors.values():
            if e.state in (ExecutorState.LAUNCHING, ExecutorState.READY):
                key = (e.container.node_id, e.role)
                have[key] = have.get(key, 0) + 1
        return have == {(node, role): n for role in Role for node, n in counts_on_nodes(placement, role).items()}

    def retire(self, rec: ExecutorRecord) -> None:
        """`rec` leaves the job (EPS remove): its container ending is expected, not a failure."""
        if rec.state is not ExecutorState.EXITED:
            rec.on(ExecutorEvent.RETIRE)
            self._changed.set()

    def count(self, role: Role) -> int:
        """Executors of `role` the job has now: launching or serving, not retiring or exited."""
        return sum(1 for e in self.executors.values()
                   if e.role is role and e.state in (ExecutorState.LAUNCHING, ExecutorState.READY))

    def mark_exited(self, container: AmContainer) -> Optional[ExecutorRecord]:
        """`container` completed (the RM's report): its executor is EXITED, its address lost, and,
        unless it was retiring, it counts as lost (module doc)."""
        rec = self._by_container.get(container.container_id)
        if rec is not None:
            was = rec.state
            rec.container = container
            rec.on(ExecutorEvent.EXIT)
            self._changed.set()
            if was is not ExecutorState.EXITED:
                code = container.exit_status
                self._gone(rec, f"{rec.executor_id}'s container {container.container_id} on {container.node_id} "
                                f"completed with {code} ({ExitStatus.describe(code)})",
                           lost=was is not ExecutorState.RETIRING)
        return rec

    def declare_lost(self, rec: ExecutorRecord, reason: str) -> None:
        """The AM gives up on `rec` before its container is reported gone (it stopped answering):
        its address fails every request from now on and it counts as lost. Its state changes
        when its container's completion comes (the AM stops the container)."""
        if rec.state is not ExecutorState.EXITED:
            self._gone(rec, reason, lost=rec.state is not ExecutorState.RETIRING)

    def _gone(self, rec: ExecutorRecord, reason: str, lost: bool) -> None:
        if self.links is not None and rec.address:
            self.links.mark_lost(rec.address, reason)
        if not lost:
            return
        self.lost.setdefault(rec.executor_id, reason)
        watches, self._loss_watches = self._loss_watches, []
        for ids, fut in watches:
            if fut.done():
                continue
            if rec.executor_id in ids:
                fut.set_result(rec)
            else:
                self._loss_watches.append((ids, fut))

    def watch_losses(self, recs: Iterable[ExecutorRecord]) -> asyncio.Future[ExecutorRecord]:
        """A future set to the first of `recs` that is lost (now, if one already is); cancel it
        once nothing waits on it any more."""
        recs = list(recs)
        fut: asyncio.Future[ExecutorRecord] = asyncio.get_running_loop().create_future()
        gone = next((r for r in recs if r.executor_id in self.lost), None)
        if gone is not None:
            fut.set_result(gone)
        else:
            self._loss_watches = [(ids, f) for ids, f in self._loss_watches if not f.done()]
            self._loss_watches.append((frozenset(r.executor_id for r in recs), fut))
        return fut

    # -- launch ------------------------------------------------------------------------------
    def launch_context(self, rec: ExecutorRecord, environment: dict[str, str] | None = None) -> LaunchContext:
        """The command that runs `rec` in its container; it binds the NM's host so peers reach it.
        The job secret goes in the environment, never on the command line."""
        if not self.am_address:
            raise RuntimeError("the AM's data-plane address is not known yet")
        argv = ["--executor-id", rec.executor_id, "--role", rec.role.value, "--num-blocks", str(self.num_blocks),
                "--am", self.am_address]
        command = shlex.join([self.python, "-m", EXECUTOR_MODULE, *argv]) + ' --host "${NM_HOST:-127.0.0.1}"'
        env = {"PYTHONUNBUFFERED": "1", **(environment or {}), container_env.CONTAINER_ROLE: rec.role.value}
        if self.job_secret:
            env[container_env.JOB_SECRET] = self.job_secret
        if self.harmony_group is not None or self.use_arbiter:
            env[container_env.HARMONY] = "1"
        # An NM with an executor zygote forks the executor warm (it binds $NM_HOST by default).
        warm = WarmStart(module=EXECUTOR_MODULE, argv=argv) if self.python == "python" else None
        return LaunchContext(commands=[command], environment=env, warm_start=warm,
                             local_resources=dict(self.local_resources), cpu_weighted=self.harmony_group is not None)

    # -- announcements -----------------------------------------------------------------------
    def handle_frame(self, frame: Frame) -> Reply:
        """Data-plane handler of the AM: executors announce themselves here with an
        `executor_ready` (protocol.executor_ops.ExecutorReady), decoded once; a bad one is refused
        with a RequestError naming the field. The answer is `Ok`."""
        op = frame.header.get("op")
        if op != "executor_ready":
            raise RequestError(f"unknown op {op!r} (the AM only takes executor_ready)")
        try:
            ready = ops.decode_as(frame.header, ops.ExecutorReady)
        except ops.ControlMessageError as e:
            raise RequestError(str(e)) from None
        rec = self.executors.get(ready.executor_id)
        if rec is None:
            raise RequestError(f"unknown executor {ready.executor_id!r}")
        if rec.state is ExecutorState.LAUNCHING:
            rec.on(ExecutorEvent.ANNOUNCE)
            rec.ready_at = time.monotonic()
            rec.address = ready.address
            if self.links is not None:
                self.links.clear_lost(ready.address)    # a lost executor's address, taken again (same host)
            rec.pid = ready.pid
            self._changed.set()
        return ops.encode_reply(ops.Ok()), ()

    async def wait_ready(self, role: Role, count: int, timeout_s: float) -> list[ExecutorRecord]:
        """Wait until `count` executors of `role` are READY; TimeoutError names the missing ones."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            ready = self.of_role(role, ExecutorState.READY)
            if len(ready) >= count:
                return by_index(ready)
            if not await self._changes(deadline):
                waiting = [e.executor_id for e in self.of_role(role, ExecutorState.LAUNCHING)]
                raise asyncio.TimeoutError(f"{len(ready)} of {count} {role.value}s ready after {timeout_s:.0f}s "
                                           f"(still starting: {waiting or 'none launched'})")

    async def wait_new(self, role: Role, before: set[str], n: int, timeout_s: float,
                       aborted: Optional[asyncio.Event] = None,
                       asks: Optional[set[int]] = None) -> list[ExecutorRecord]:
        """Wait until `n` executors of `role` not in `before` (and, given `asks`, in containers
        granted to one of those asks) are READY (the first n by index). RuntimeError as soon as one
        of them exits first or `aborted` is set; TimeoutError naming how many came up."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            new = [e for i, e in self.executors.items() if i not in before and e.role is role
                   and (asks is None or e.container.ask_id in asks)]
            ready = [e for e in new if e.state is ExecutorState.READY]
            if len(ready) >= n:
                return by_index(ready)[:n]
            dead = [e.executor_id for e in new if e.state is ExecutorState.EXITED]
            if dead:
                raise RuntimeError(f"new {role.value}s {dead} exited before they started")
            if aborted is not None and aborted.is_set():
                raise RuntimeError(f"the launch of {n} {role.value}s was aborted")
            if not await self._changes(deadline, aborted):
                raise asyncio.TimeoutError(f"{len(ready)} of {n} new {role.value}s ready after {timeout_s:.0f}s")

    async def wait_exited(self, recs: list[ExecutorRecord], timeout_s: float) -> None:
        """Wait until every one of `recs` has EXITED; TimeoutError naming those still running."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            running = [e.executor_id for e in recs if e.state is not ExecutorState.EXITED]
            if not running:
                return
            if not await self._changes(deadline):
                raise asyncio.TimeoutError(f"after {timeout_s:.0f}s executors still running: {running}")

    async def _changes(self, deadline: float, also: Optional[asyncio.Event] = None) -> bool:
        """Wait for the next change of any executor's state (or `also` to be set) until `deadline`
        (loop time); False once the deadline has passed. The waits above check, then call this."""
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return False
        self._changed.clear()
        waits = [asyncio.ensure_future(self._changed.wait())]
        if also is not None:
            waits.append(asyncio.ensure_future(also.wait()))
        try:
            await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return True

    def shape_status(self) -> ShapeStatus:
        """The job's shape as its status shows it: the executors it was given, each one's `state`
        telling whether it still runs."""
        ids = sorted(self.executors.values(), key=lambda e: (e.role.value, executor_index(e)))
        return ShapeStatus(workers=len(self.workers), servers=len(self.servers), executors=[e.status() for e in ids])
