"""Capacity scheduler: queues with guaranteed / maximum shares, DRF between users, FIFO per user.

Pure: it reads and updates the `Node` records it is given and its own accounting; the core turns
its `Allocation` decisions into containers. Order of service for each container:
  1. the queue furthest below its guaranteed share (dominant share / guaranteed fraction);
  2. inside it, AM containers of ACCEPTED apps first (FIFO), then the user with the lowest
     dominant share (DRF), then that user's apps in submission order, asks by (priority, ask_id).
An AM container is only scheduled for an app the queue's AM limit has activated (rm/am_limit.py).
Gang admission (RMConfig.gang_admission): an app with a `Gang` (a PS job: its minimum executor set)
gets its AM container only when the AM and the gang fit together, in the queue's headroom and on
the nodes (first fit over every schedulable node's free room, less the gangs admitted earlier whose
executors have not all been allocated yet: those stay reserved against further admissions). So a
job holds nothing until it can run; one that does not fit is skipped, not waited for (as YARN skips
AMs over the AM limit). The reservation only guards admissions: it does not hold back other apps'
asks (YARN's node reservations), so a gang's executors can still be taken in the seconds between
its AM's start and its asks; the policies then make room as for any job short of executors.
A new attempt of an app that keeps its containers across attempts needs room only for the gang's
executors it does not hold already (`hold_gang_executors`: the failed attempt's, handed over).
Locality: an ask's `nodes` are tried first; with relax_locality=False only they are used.
Node labels are exclusive partitions (protocol/node_labels.py): executors go to unlabelled nodes
only, AM containers to the nodes carrying `am_node_label` when one is set.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from protocol import internal_api as api
from protocol import node_labels
from protocol.config import QueueConfig, RMConfig
from protocol.records import ZERO, Resource

from .am_limit import AmGate, am_resource_limit, limit_diagnostics
from .model import Node
from protocol.errors import ProtocolError

AM_ASK_ID = -1   # the ask id an AM container is allocated under
# YARN's numContainers is an int32. Bounded so that the pending sums the RM serves (counts, and
# count x memory in the policies' figures) stay well inside 64 bits.
MAX_ASK_COUNT = 2 ** 31 - 1
GANG_DIAGNOSTICS = "Application is waiting for its gang: its AM and minimum executors do not fit yet."


def gang_diagnostics(gang: "Gang", am: Resource) -> str:
    """The diagnostics of an app whose AM gang admission holds back, with the figures."""
    return (f"{GANG_DIAGNOSTICS} Details : AM <memory:{am.memory}, vCores:{am.vcores}> + {gang.count} x "
            f"executor <memory:{gang.executor.memory}, vCores:{gang.executor.vcores}>")


class AskError(ProtocolError, ValueError):
    """A resource ask the scheduler cannot accept (names the field and the limit)."""


@dataclass
class Ask:
    """One row of an app's ask table, with a normalised resource."""

    ask_id: int
    count: int
    resource: Resource
    priority: int = 0
    nodes: tuple[str, ...] = ()
    relax_locality: bool = True
    tag: str = ""


@dataclass(frozen=True)
class Gang:
    """The executors an app needs beside its AM before the AM container is started."""

    executor: Resource
    count: int


@dataclass
class SchedApp:
    """The scheduler's view of one app: its queue, user, demand and usage."""

    app_id: str
    queue: str
    user: str
    seq: int
    asks: dict[int, Ask] = field(default_factory=dict)
    am_request: Optional[Resource] = None
    am_active: bool = False     # activated by the AM limit, AM container not allocated yet
    used: Resource = ZERO
    gang: Optional[Gang] = None
    gang_reserved: int = 0      # executors of the gang admitted with the AM not allocated yet
    gang_waiting: bool = False  # the AM was passed over last time: the gang did not fit
    gang_checked: Optional[int] = None   # the state version that check saw (see `state_version`)
    gang_held: int = 0          # the gang's executors the app holds already (kept across attempts)

    @property
    def gang_needed(self) -> int:
        """The gang's executors the AM's admission must still find room for."""
        return max(0, self.gang.count - self.gang_held) if self.gang is not None else 0

    @property
    def has_demand(self) -> bool:
        return self.am_request is not None or any(a.count > 0 for a in self.asks.values())


@dataclass
class Queue:
    """A leaf queue of the capacity scheduler."""

    name: str
    capacity: float        # percent guaranteed
    max_capacity: float    # percent ceiling
    am: AmGate = field(default_factory=lambda: AmGate(1.0))
    used: Resource = ZERO
    apps: dict[str, SchedApp] = field(default_factory=dict)
    user_used: dict[str, Resource] = field(default_factory=dict)


@dataclass(frozen=True)
class Allocation:
    """One scheduling decision: give `app_id` a container of `resource` on `node_id`."""

    app_id: str
    node_id: str
    resource: Resource
    ask_id: int
    tag: str = ""

    @property
    def is_am(self) -> bool:
        return self.ask_id == AM_ASK_ID


class CapacityScheduler:
    """Queues, ask tables and allocation passes (see the module docstring for the order)."""

    def __init__(self, cfg: RMConfig, lookup_nodes: Callable[[str], list[Node]],
                 cluster_total: Callable[[], Resource],
                 on_activation: Callable[[str, Optional[str]], None] = lambda app_id, diagnostics: None,
                 schedulable_nodes: Callable[[], list[Node]] = lambda: [],
                 on_gang: Callable[[str, Optional[str]], None] = lambda app_id, diagnostics: None,
                 state_version: Optional[Callable[[], int]] = None):
        if not cfg.queues:
            raise ValueError("at least one queue must be configured")
        if not (0 < cfg.max_am_resource_percent <= 1):
            raise ValueError(f"max_am_resource_percent must be a fraction in (0, 1], got {cfg.max_am_resource_percent}")
        self.min_mb = max(1, cfg.minimum_allocation_mb)
        self.maximum = Resource(cfg.maximum_allocation_mb, cfg.maximum_allocation_vcores)
        self.am_node_label = cfg.am_node_label   # AMs only on nodes carrying it (protocol/node_labels.py)
        self.queues: dict[str, Queue] = {}
        for q in cfg.queues:
            self._check_queue(q)
            fraction = cfg.max_am_resource_percent if q.max_am_resource_percent is None else q.max_am_resource_percent
            self.queues[q.name] = Queue(q.name, q.capacity, q.max_capacity, AmGate(fraction))
        self.apps: dict[str, SchedApp] = {}
        self._cluster_total = cluster_total
        self._lookup_nodes = lookup_nodes
        # App ids with outstanding demand, per queue, so idle passes are O(1) and busy ones O(demand).
        self._demand: dict[str, set[str]] = {name: set() for name in self.queues}
        self._n_demand = 0
        # Told (app_id, diagnostics) when an app is held back by the AM limit, (app_id, None) when activated.
        self._on_activation = on_activation
        self._admitted_total: Resource = ZERO   # cluster total the AM limits were last computed for
        self._schedulable_nodes = schedulable_nodes     # every node a gang may be placed on
        # Told (app_id, diagnostics) when gang admission starts holding an app's AM back, (app_id, None) when not.
        self._on_gang = on_gang
        # A number that changes whenever the room on the nodes or the gangs held may have changed
        # (the core's policy_version): a gang that did not fit is not checked again until it does --
        # the check walks every node and reservation, and a busy cluster heartbeats many times a
        # second with nothing freed. None: check every time.
        self._state_version = state_version

    @staticmethod
    def _check_queue(q: QueueConfig) -> None:
        if not q.name:
            raise ValueError("queue name must not be empty")
        if not (0 < q.capacity <= 100) or not (q.capacity <= q.max_capacity <= 100):
            raise ValueError(f"queue {q.name!r}: need 0 < capacity <= max_capacity <= 100, "
                             f"got capacity={q.capacity} max_capacity={q.max_capacity}")
        if q.max_am_resource_percent is not None and not (0 < q.max_am_resource_percent <= 1):
            raise ValueError(f"queue {q.name!r}: max_am_resource_percent must be a fraction in (0, 1], "
                             f"got {q.max_am_resource_percent}")

    # ----- normalisation ------------------------------------------------------------------
    def normalize(self, r: Resource, what: str = "resource") -> Resource:
        """Round memory up to the minimum allocation; reject non-positive or too-big resources."""
        if r.memory <= 0:
            raise AskError(f"{what}.memory must be positive, got {r.memory}")
        if r.vcores <= 0:
            raise AskError(f"{what}.vCores must be positive, got {r.vcores}")
        if r.memory > self.maximum.memory or r.vcores > self.maximum.vcores:
            raise AskError(f"{what} {{memory: {r.memory}, vCores: {r.vcores}}} exceeds the maximum allocation "
                           f"{{memory: {self.maximum.memory}, vCores: {self.maximum.vcores}}}")
        mem = -(-r.memory // self.min_mb) * self.min_mb
        return Resource(min(mem, self.maximum.memory), r.vcores)

    def validate_asks(self, asks: Iterable[api.ResourceAsk]) -> list[Ask]:
        """Normalise a batch of asks, all or nothing (AskError names the bad one)."""
        out = []
        for i, a in enumerate(asks):
            if not 0 <= a.count <= MAX_ASK_COUNT:
                raise AskError(f"asks[{i}].count must be within 0..{MAX_ASK_COUNT}, got {a.count}")
            res = self.normalize(a.resource, f"asks[{i}].resource")
            out.append(Ask(a.ask_id, a.count, res, a.priority, tuple(a.nodes), a.relax_locality, a.tag))
        return out

    # ----- demand bookkeeping ----------------------------------------------------------------
    def _mark(self, sa: SchedApp) -> None:
        """Keep the demand index in step with `sa.has_demand`."""
        bucket = self._demand[sa.queue]
        if sa.has_demand and sa.app_id in self.apps:
            if sa.app_id not in bucket:
                bucket.add(sa.app_id)
                self._n_demand += 1
        elif sa.app_id in bucket:
            bucket.discard(sa.app_id)
            self._n_demand -= 1

    # ----- apps ---------------------------------------------------------------------------
    def add_app(self, app_id: str, queue: str, user: str, seq: int, gang: Optional[Gang] = None) -> None:
        if queue not in self.queues:
            raise KeyError(f"unknown queue {queue!r}")
        if gang is not None and gang.count < 0:
            raise ValueError(f"gang count must be >= 0, got {gang.count}")
        sa = SchedApp(app_id, queue, user, seq, gang=gang)
        self.apps[app_id] = sa
        self.queues[queue].apps[app_id] = sa

    def remove_app(self, app_id: str) -> None:
        """Forget an app's demand (its containers are released one by one by the core)."""
        sa = self.apps.get(app_id)
        if sa is not None:
            self._drop_am_request(sa)
            del self.apps[app_id]
            self.queues[sa.queue].apps.pop(app_id, None)
            self._mark(sa)

    def move_app(self, app_id: str, target: str, live_am: Resource = ZERO) -> None:
        """Move an app to queue `target` with everything it holds and asks for (YARN's move to
        queue): its usage, per user too, leaves the old queue and is charged to the new one; an AM
        request not yet allocated waits for the new queue's AM limit; `live_am`, its allocated AM
        container's resource (the core knows it), moves from the old queue's AM charge to the new
        one's. AskError (nothing changed) if the target is unknown or its maximum capacity cannot
        take what the app holds."""
        sa = self.apps[app_id]
        if target not in self.queues:
            raise AskError(f"queue: unknown queue {target!r}; known queues: {', '.join(self.queues)}")
        old, new = self.queues[sa.queue], self.queues[target]
        if old is new:
            return
        limit = self.queue_limit(new)
        if not (new.used + sa.used).fits_in(limit):
            raise AskError(f"queue {target!r}: moving {app_id} would exceed its maximum capacity "
                           f"({new.max_capacity:g} %: {limit.memory} MB, {limit.vcores} vCores; it holds "
                           f"{new.used.memory} MB, {new.used.vcores} vCores, the app {sa.used.memory} MB, "
                           f"{sa.used.vcores} vCores)")
        am_request = sa.am_request
        self._drop_am_request(sa)                   # from the old queue's AM gate (its charge back)
        if sa.app_id in self._demand[old.name]:
            self._demand[old.name].discard(sa.app_id)
            self._n_demand -= 1
        minus = Resource(-sa.used.memory, -sa.used.vcores)
        old.used = old.used + minus
        old.user_used[sa.user] = old.user_used.get(sa.user, ZERO) + minus
        new.used = new.used + sa.used
        new.user_used[sa.user] = new.user_used.get(sa.user, ZERO) + sa.used
        if live_am != ZERO:
            old.am.uncharge(live_am)
            new.am.charge(live_am)
        del old.apps[app_id]
        new.apps[app_id] = sa
        sa.queue = target
        self._mark(sa)
        self._admit(old)                            # room its AM left in the old queue's AM limit
        if am_request is not None:
            self.request_am(app_id, am_request)     # waits for the new queue's AM limit

    def request_am(self, app_id: str, resource: Resource) -> None:
        """A new attempt needs an AM container; it is scheduled once the AM limit activates the app."""
        sa = self.apps[app_id]
        self._drop_am_request(sa)
        sa.am_request = resource
        q = self.queues[sa.queue]
        q.am.add(app_id, sa.seq, resource)
        self._mark(sa)
        self._admit(q)

    def hold_gang_executors(self, app_id: str, count: int) -> None:
        """The app's next AM is admitted with `count` of its gang's executors in hand (containers a
        failed attempt passed on): only the rest must fit."""
        sa = self.apps.get(app_id)
        if sa is not None:
            sa.gang_held = max(0, count)
            sa.gang_checked = None

    def cap_gang_reservation(self, app_id: str, executors: int) -> None:
        """The app's admitted gang holds room for at most `executors` more executors: the job's
        shape is now decided elsewhere -- 0 once it trains (its AM's report says started), a
        directive's whole shape once a policy sets it (a paused job: 0). Held for the attempt's
        life, the room of executors the job will never ask for blocked the admission of every
        later AM while the cluster sat idle."""
        sa = self.apps.get(app_id)
        if sa is not None and sa.gang_reserved > max(0, executors):
            sa.gang_reserved = max(0, executors)
            for o in self.apps.values():
                if o.gang_waiting:
                    o.gang_checked = None       # room came free: a waiting gang is looked at again

    def clear_demand(self, app_id: str) -> None:
        sa = self.apps.get(app_id)
        if sa is not None:
            self._drop_am_request(sa)
            sa.asks.clear()
            sa.gang_reserved = 0        # the attempt ended: its gang's room is no longer held
            self._mark(sa)

    def _drop_am_request(self, sa: SchedApp) -> None:
        """Withdraw an AM request not yet allocated, giving back its activation charge."""
        q = self.queues[sa.queue]
        if sa.am_request is None:
            return
        if sa.am_active:
            q.am.uncharge(sa.am_request)
            sa.am_active = False
        q.am.drop(sa.app_id)
        sa.am_request = None
        self._admit(q)

    # ----- AM limit -----------------------------------------------------------------------
    def am_limit(self, q: Queue) -> Resource:
        """The most the queue's active AMs may hold (besides the one AM a queue always admits)."""
        return am_resource_limit(self.total, q.capacity, q.am.fraction, self.min_mb)

    def _admit(self, q: Queue) -> None:
        """Activate the queue's waiting apps that now fit its AM limit; tell the core about changes."""
        if not q.am.pending:
            return
        activated, blocked = q.am.admit(self.am_limit(q))
        for app_id in activated:
            self.apps[app_id].am_active = True
            self._on_activation(app_id, None)
        for app_id in blocked:
            r = q.am.pending[app_id][1]
            self._on_activation(app_id, limit_diagnostics(r, q.am.limit, q.am.used))

    def update_asks(self, app_id: str, asks: list[Ask], undelivered: dict[int, int]) -> None:
        """Replace ask rows. Containers allocated but not yet delivered count against `count`,
        since the AM could not have known about them when it wrote the count."""
        sa = self.apps[app_id]
        for a in asks:
            a.count = max(0, a.count - undelivered.get(a.ask_id, 0))
            if a.count == 0:
                sa.asks.pop(a.ask_id, None)
            else:
                sa.asks[a.ask_id] = a
        self._mark(sa)

    @property
    def total(self) -> Resource:
        """Capability of the schedulable nodes (owned by the node tracker)."""
        return self._cluster_total()

    @property
    def has_demand(self) -> bool:
        return self._n_demand > 0

    # ----- accounting ---------------------------------------------------------------------
    def _charge(self, sa: SchedApp, node: Optional[Node], r: Resource, sign: int) -> None:
        delta = r if sign > 0 else Resource(-r.memory, -r.vcores)
        if node is not None:
            node.used = node.used + delta
        sa.used = sa.used + delta
        q = self.queues[sa.queue]
        q.used = q.used + delta
        q.user_used[sa.user] = q.user_used.get(sa.user, ZERO) + delta

    def release(self, app_id: str, queue: str, user: str, node: Optional[Node], r: Resource,
                is_am: bool = False) -> None:
        """Give back a container's resources (the app may already have been removed). `node` is
        None when the node keeps the resources charged until its NM confirms the container is gone."""
        sa = self.apps.get(app_id) or SchedApp(app_id, queue, user, 0)
        self._charge(sa, node, r, -1)
        if is_am:
            q = self.queues[queue]
            q.am.uncharge(r)
            self._admit(q)

    def adopt(self, app_id: str, node: Node, r: Resource, is_am: bool) -> None:
        """Charge a container re-adopted after an RM restart or failover (its NM reported it) to
        its app, queue, user and node, as its allocation charged them; an AM container also to its
        queue's AM limit."""
        sa = self.apps[app_id]
        self._charge(sa, node, r, +1)
        if is_am:
            self.queues[sa.queue].am.charge(r)

    def queue_limit(self, q: Queue) -> Resource:
        return Resource(int(self.total.memory * q.max_capacity / 100), int(self.total.vcores * q.max_capacity / 100))

    def headroom(self, app_id: str) -> Resource:
        """What the app's queue may still grow by (YARN's 'available' in an allocate response)."""
        sa = self.apps.get(app_id)
        if sa is None:
            return ZERO
        lim = self.queue_limit(self.queues[sa.queue]) - self.queues[sa.queue].used
        return Resource(max(0, lim.memory), max(0, lim.vcores))

    # ----- allocation ---------------------------------------------------------------------
    def allocate(self, candidates: list[Node]) -> list[Allocation]:
        """Allocate as much outstanding demand as fits on `candidates` (schedulable nodes)."""
        out: list[Allocation] = []
        if not self._n_demand:
            return out
        total = self.total
        if total != self._admitted_total:
            # AM limits scale with the cluster: nodes that joined may let waiting apps in.
            self._admitted_total = total
            for q in self.queues.values():
                self._admit(q)
        if not candidates:
            return out
        smallest = Resource(self.min_mb, 1)
        # A full node cannot take anything: keeps heartbeats of busy nodes cheap.
        cand = {n.node_id: n for n in candidates if n.schedulable and smallest.fits_in(n.free)}
        if not cand:
            return out
        while True:
            a = self._allocate_one(cand)
            if a is None:
                return out
            out.append(a)

    def _queue_order(self) -> list[Queue]:
        qs = [q for q in self.queues.values() if self._demand[q.name]]

        def key(q: Queue) -> tuple[float, str]:
            return (q.used.dominant_share(self.total) / (q.capacity / 100.0), q.name)
        return sorted(qs, key=key)

    def _allocate_one(self, cand: dict[str, Node]) -> Optional[Allocation]:
        for q in self._queue_order():
            limit = self.queue_limit(q)
            demand = [q.apps[aid] for aid in self._demand[q.name]]
            # AM containers first, FIFO.
            for sa in sorted((s for s in demand if s.am_request is not None and s.am_active), key=lambda s: s.seq):
                r = sa.am_request
                assert r is not None
                if not (q.used + r).fits_in(limit):
                    continue
                node = self._pick_node(r, None, cand, is_am=True)
                if node is not None and sa.gang is not None and sa.gang_needed > 0:
                    version = self._state_version() if self._state_version is not None else None
                    if sa.gang_waiting and version is not None and version == sa.gang_checked:
                        continue        # nothing changed since its gang did not fit
                    sa.gang_checked = version
                    waiting = not self._gang_fits(q, limit, sa, r, node)
                    if waiting != sa.gang_waiting:
                        sa.gang_waiting = waiting
                        self._on_gang(sa.app_id, gang_diagnostics(sa.gang, r) if waiting else None)
                    if waiting:
                        continue        # holds nothing until AM and gang fit; the next AM may
                if node is not None:
                    # The activation charge now belongs to the AM container (given back on its release).
                    sa.am_request, sa.am_active = None, False
                    if sa.gang is not None:
                        sa.gang_reserved = sa.gang_needed
                    return self._commit(sa, node, r, AM_ASK_ID, "AM")
            # Then DRF between users, FIFO within a user.
            by_user: dict[str, list[SchedApp]] = {}
            for sa in demand:
                if sa.asks:
                    by_user.setdefault(sa.user, []).append(sa)
            users = sorted(by_user, key=lambda u: (q.user_used.get(u, ZERO).dominant_share(self.total), u))
            for u in users:
                for sa in sorted(by_user[u], key=lambda s: s.seq):
                    for ask in sorted(sa.asks.values(), key=lambda a: (a.priority, a.ask_id)):
                        if ask.count <= 0 or not (q.used + ask.resource).fits_in(limit):
                            continue
                        node = self._pick_node(ask.resource, ask, cand)
                        if node is not None:
                            ask.count -= 1
                            if ask.count == 0:
                                del sa.asks[ask.ask_id]
                            return self._commit(sa, node, ask.resource, ask.ask_id, ask.tag)
        return None

    def _gang_fits(self, q: Queue, limit: Resource, sa: SchedApp, am: Resource, am_node: Node) -> bool:
        """Whether `sa`'s AM on `am_node` and its gang fit: in the queue's limit and, first fit,
        on the schedulable nodes executors may use, after the gangs still reserved (in order)."""
        gang = sa.gang
        assert gang is not None
        reserved = [o for o in self.apps.values() if o.gang_reserved > 0 and o.gang is not None and o is not sa]
        held = sum((o.gang.executor.scale(o.gang_reserved) for o in reserved
                    if o.queue == q.name and o.gang is not None), ZERO)
        need = sa.gang_needed
        if not (q.used + held + am + gang.executor.scale(need)).fits_in(limit):
            return False
        free = {n.node_id: n.free for n in self._schedulable_nodes()
                if n.schedulable and node_labels.accepts(n.labels, False, self.am_node_label)}
        if am_node.node_id in free:
            free[am_node.node_id] = free[am_node.node_id] - am
        order = sorted(free)

        def place(r: Resource, k: int) -> bool:
            for _ in range(k):
                at = next((i for i in order if r.fits_in(free[i])), None)
                if at is None:
                    return False
                free[at] = free[at] - r
            return True
        for o in sorted(reserved, key=lambda o: o.seq):
            assert o.gang is not None
            place(o.gang.executor, o.gang_reserved)   # what no longer fits is not held against us
        return place(gang.executor, need)

    def _commit(self, sa: SchedApp, node: Node, r: Resource, ask_id: int, tag: str) -> Allocation:
        if ask_id != AM_ASK_ID and sa.gang_reserved:
            sa.gang_reserved -= 1       # one executor of the admitted gang is in place
        self._charge(sa, node, r, +1)
        self._mark(sa)
        return Allocation(sa.app_id, node.node_id, r, ask_id, tag)

    def _pick_node(self, r: Resource, ask: Optional[Ask], cand: dict[str, Node],
                   is_am: bool = False) -> Optional[Node]:
        # Node labels are exclusive partitions: an AM goes to the AM label's nodes where one is set,
        # everything else to unlabelled nodes only, whatever an ask's locality names.
        def allowed(n: Node) -> bool:
            return node_labels.accepts(n.labels, is_am, self.am_node_label)
        cand = {k: n for k, n in cand.items() if allowed(n)}
        if ask is not None and ask.nodes:
            preferred = [n for name in ask.nodes for n in self._lookup_nodes(name) if n.schedulable and allowed(n)]
            for n in preferred:
                if n.node_id in cand and r.fits_in(n.free):
                    return n
            if not ask.relax_locality:
                return None
            # A preferred node has room but is not in this pass: leave the ask for its turn.
            if any(r.fits_in(n.free) for n in preferred):
                return None
        for n in cand.values():
            if r.fits_in(n.free):
                return n
        return None
