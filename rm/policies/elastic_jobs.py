"""The elastic PS jobs of a snapshot as the partitioning policies (`dorm`, `drf`, `tetris`) see them.

These policies give every PS job a partition of the cluster -- a number of executors on each
node -- and resize the partitions. Here a snapshot becomes:

* per job (`ElasticJob`): its demand vector (one executor's resource: Dorm's d, every executor of
  a job is the same size), its weight, its bounds on executors (Dorm's n_min / n_max: the spec's
  min / max workers plus min / max servers), where its executors are now (per node) and whether it
  has started. A job that has not started is fixed at its submitted shape: the PS AM starts a job
  with exactly the workers and servers it was submitted with and acts on directives only once
  training has begun (appmaster/ps/controller/rules.py), so a policy can only make room for it.
* per node: the room the jobs' executors may share (`ElasticView.room`): the node's capacity less
  what is not theirs to move (AM containers, other apps); containers released but still held
  until the NM confirms them gone count as room (they are free within a heartbeat).
* the AMs still to be placed: a job whose AM container is not granted needs room for it too, or a
  cluster the policy keeps full would never start another job. Likewise the ungranted demand of
  apps that are not PS jobs is kept out of the room (from the roomiest nodes; an approximation:
  their asks' sizes and locality are not looked at).

Apps held back by their queue's AM limit (`AppView.am_limited`) are left out, as in `eps`: the
scheduler will not start them whatever is free.
"""
from __future__ import annotations

from dataclasses import dataclass

from protocol.internal_api import NodePlacement
from protocol.records import ZERO, NodeState, Resource

from .decision import JobDecision
from .snapshot import AppView, ClusterSnapshot, PSJobView


@dataclass(frozen=True)
class ElasticJob:
    """One PS job: bounds per role, demand per executor, where its executors are now (`current`:
    the RM's latest directive's placement when it has one -- the AM is moving there -- else where
    its containers run)."""

    app_id: str
    submit_time: float
    demand: Resource
    weight: float
    min_workers: int
    max_workers: int
    min_servers: int
    max_servers: int
    workers: int
    servers: int
    current: tuple[NodePlacement, ...]
    started: bool
    am: Resource = ZERO          # the AM still to place (ZERO: granted)
    am_held: Resource = ZERO     # the AM container the job holds (ZERO: not granted yet)

    @property
    def order(self) -> tuple[float, str]:
        return (self.submit_time, self.app_id)

    @property
    def n_min(self) -> int:
        return self.min_workers + self.min_servers

    @property
    def n_max(self) -> int:
        return self.max_workers + self.max_servers

    def share(self, n: int, total: Resource) -> float:
        """The job's dominant share of `total` with `n` executors, its AM counted (granted or
        still to place: an AM holds cluster resources like any container, so a job's share in
        DRF and Dorm's fairness includes it), divided by its weight."""
        return (self.am + self.am_held + self.demand.scale(n)).dominant_share(total) / self.weight

    def current_on(self) -> dict[str, int]:
        """Executors per node now."""
        return {p.node: p.workers + p.servers for p in self.current if p.workers + p.servers}

    def split(self, n: int) -> tuple[int, int]:
        """`n` executors as (workers, servers) within the role bounds, as near the job's current
        worker:server ratio as they allow (n must lie in [n_min, n_max])."""
        ratio = self.workers / (self.workers + self.servers) if self.workers + self.servers else 0.5
        lo = max(self.min_workers, n - self.max_servers)
        hi = min(self.max_workers, n - self.min_servers)
        w = max(0, min(n, hi, max(lo, round(n * ratio))))
        return w, n - w

    def decision(self, per_node: dict[str, int], reason: str) -> JobDecision:
        """A JobDecision placing `per_node` executors; each node keeps the roles it has now as far
        as the new counts allow (fewer executors move between roles)."""
        n = sum(per_node.values())
        workers, servers = self.split(n)
        now = {p.node: (p.workers, p.servers) for p in self.current}
        nodes = sorted(k for k, v in per_node.items() if v > 0)
        # Keep each node's current workers, then its servers, within the new count; the slots left
        # over take the workers still missing (first nodes first), then kept servers turn into
        # workers if need be -- or, with too many workers kept, the last nodes' workers turn into
        # servers.
        w_on = {k: min(per_node[k], now.get(k, (0, 0))[0]) for k in nodes}
        s_kept = {k: min(per_node[k] - w_on[k], now.get(k, (0, 0))[1]) for k in nodes}
        short = workers - sum(w_on.values())
        for free_only in (True, False):
            for k in nodes:
                if short <= 0:
                    break
                slots = per_node[k] - w_on[k] - (s_kept[k] if free_only else 0)
                add = min(short, max(0, slots))
                w_on[k] += add
                short -= add
        for k in reversed(nodes):
            if short >= 0:
                break
            drop = min(-short, w_on[k])
            w_on[k] -= drop
            short += drop
        placement = tuple(NodePlacement(node=k, workers=w_on[k], servers=per_node[k] - w_on[k]) for k in nodes)
        return JobDecision(workers, servers, placement, reason=reason)


@dataclass(frozen=True)
class ElasticView:
    """The jobs (in submission order), the schedulable nodes (sorted) with their capacity and room
    for the jobs' executors and AMs to place, and the cluster total that shares are taken of."""

    jobs: tuple[ElasticJob, ...]
    nodes: tuple[str, ...]
    capacity: tuple[Resource, ...]
    room: tuple[Resource, ...]
    total: Resource

    @property
    def started(self) -> tuple[ElasticJob, ...]:
        return tuple(j for j in self.jobs if j.started)

    def changed(self, job: ElasticJob, per_node: dict[str, int]) -> bool:
        """Whether `per_node` is a partition within the job's bounds that differs from where its
        executors are now (one below n_min -- room lost with a node -- is no directive to give)."""
        n = sum(per_node.values())
        return job.n_min <= n <= job.n_max and {k: v for k, v in per_node.items() if v} != job.current_on()


def _job(app: AppView, spec: PSJobView) -> ElasticJob:
    report = app.shape
    demand = (report.executor_resource if report is not None and report.executor_resource is not None
              else spec.executor)
    am_granted = app.am_resource.fits_in(app.resources) and app.resources != ZERO
    am = ZERO if am_granted else app.am_resource
    held = app.am_resource if am_granted else ZERO
    # A job's lower bounds never exceed its submitted shape (the spec check enforces it at submission).
    min_w, min_s = min(spec.min_workers, spec.workers), min(spec.min_servers, spec.servers)
    if app.started and report is not None:
        d = app.heading_to
        current = tuple(d.placement) if d is not None and d.placement else app.executors
        workers, servers = ((d.workers, d.servers) if d is not None
                            else (report.workers, report.servers))
        return ElasticJob(app.app_id, app.submit_time, demand, spec.weight, min_w, spec.max_workers,
                          min_s, spec.max_servers, workers, servers, current, True, am, held)
    # Not started: fixed at the submitted shape (see the module doc).
    return ElasticJob(app.app_id, app.submit_time, demand, spec.weight, spec.workers, spec.workers, spec.servers,
                      spec.servers, spec.workers, spec.servers, app.executors, False, am, held)


def elastic_view(snapshot: ClusterSnapshot) -> ElasticView:
    """The snapshot's PS jobs and the room their executors share on each schedulable node."""
    jobs: list[ElasticJob] = []
    for app in sorted(snapshot.apps, key=lambda a: (a.submit_time, a.app_id)):
        if app.state.is_final or app.am_limited:
            continue
        if app.ps is not None:
            jobs.append(_job(app, app.ps))
    held: dict[str, Resource] = {}      # per node, what the jobs' executors hold now (movable)
    by_id = {a.app_id: a for a in snapshot.apps}
    for j in jobs:
        for p in by_id[j.app_id].executors:
            held[p.node] = held.get(p.node, ZERO) + j.demand.scale(p.workers + p.servers)
    nodes = sorted((n for n in snapshot.nodes if n.state == NodeState.RUNNING), key=lambda n: n.node_id)
    # Containers released but not yet confirmed gone by their NM (NodeView.releasing) are room: the
    # scheduler grants them again within a heartbeat. Counted as taken, every shrink hid its own
    # executors' room for a round and DRF's shares fell and rose again (a job flipped between two
    # sizes every ~2 s on the simulated 16-node trace: 2,064 directives for 30 jobs).
    room = [clamp0(n.capacity - n.used + n.releasing + held.get(n.node_id, ZERO)) for n in nodes]
    # Other apps' demand the scheduler has not granted yet (a YARN app beside the PS jobs) is kept
    # free, or a policy that fills the cluster would starve it: taken from the roomiest nodes.
    ps = {j.app_id for j in jobs}
    for app in snapshot.apps:
        if app.app_id in ps or app.state.is_final or app.am_limited or app.pending == ZERO:
            continue
        want = app.pending
        for k in sorted(range(len(room)), key=lambda i: (-room[i].vcores, -room[i].memory, i)):
            take = Resource(min(want.memory, room[k].memory), min(want.vcores, room[k].vcores))
            room[k], want = room[k] - take, want - take
    return ElasticView(tuple(jobs), tuple(n.node_id for n in nodes), tuple(n.capacity for n in nodes), tuple(room),
                       snapshot.total)


def clamp0(r: Resource) -> Resource:
    return Resource(max(0, r.memory), max(0, r.vcores))


__all__ = ["ElasticJob", "ElasticView", "clamp0", "elastic_view"]
