"""A scripted world for the pure `harmony` policy: nodes, PS apps whose AMs obey every directive
at once and report the COMP / COMM times their true profile gives at the shape they were told.
One `step()` is one policy round, one second on the snapshots' clock.

An app's report carries the times its subtasks held their grants (its true profile) and, as the
whole times, those plus `wait_s` per mini-batch spent waiting for grants (set it to model
partners' COMPs); `held=False` makes an AM that reports whole times only. The snapshot shows each
app's executors where its directive put them, plus `lingering` ones (executors not gone yet), or
`stuck` ones instead (a move that failed)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.job_report import JobReport, WorkerTiming
from protocol.records import ZERO, Resource
from rm.policies import ClusterSnapshot, Decision, NodeView, Policy
from rm.policies.snapshot import AppView, ps_job_view

AM = Resource(512, 1)


@dataclass
class App:
    app_id: str
    t_cpu1: float           # true COMP time per iteration on one machine
    t_net: float            # true COMM time per iteration
    submit_time: float
    state: str = "RUNNING"
    directive: Optional[ShapeDirective] = None
    iterations: int = 0
    history: list[ShapeDirective] = field(default_factory=list)
    am_node: Optional[str] = None   # where its AM runs (None: not placed yet)
    wait_s: float = 0.0             # per mini-batch, waited for grants (in the whole times only)
    held: bool = True               # the AM reports held times
    lingering: tuple[NodePlacement, ...] = ()   # executors still on nodes it was moved off
    # Executors that stay here while it runs, whatever its directive says (a move its AM gave up
    # on: it acted on the directive, its report is steady, its executors did not move).
    stuck: Optional[tuple[NodePlacement, ...]] = None
    spec: dict[str, object] = field(default_factory=dict)   # ps-job spec fields over the default one
    # The link: a worker's whole exchange per mini-batch takes `link_s` on it, (m-1)/m of which its
    # COMM pays on m nodes (models/harmony.py `net_time`); it reports `bytes_per_batch`.
    link_s: float = 0.0
    bytes_per_batch: float = 0.0

    def executors(self) -> tuple[NodePlacement, ...]:
        d = self.directive
        placed = () if d is None or d.run_state is RunState.PAUSE or d.workers == 0 else d.placement
        if placed and self.stuck is not None:
            placed = self.stuck
        return tuple(placed) + self.lingering

    def report(self) -> JobReport:
        d = self.directive
        if d is None or d.run_state is RunState.PAUSE or d.workers == 0:
            return JobReport(workers=0, servers=0, started=True, iterations=self.iterations,
                             directive_version=0 if d is None else d.version)
        return JobReport(workers=d.workers, servers=d.servers, started=True, iterations=self.iterations,
                         directive_version=d.version, executor_resource=d.executor_resource,
                         worker_times=self.times(d.workers))

    def times(self, workers: int) -> WorkerTiming:
        cpu = self.t_cpu1 / workers
        net = self.t_net + self.link_s * (workers - 1) / workers
        b = self.bytes_per_batch
        if not self.held:
            return WorkerTiming(compute_s=cpu + self.wait_s, comm_s=net, workers=workers, bytes_per_batch=b)
        return WorkerTiming(compute_s=cpu + self.wait_s, comm_s=net, workers=workers,
                            compute_held_s=cpu, comm_held_s=net, compute_wait_s=self.wait_s, bytes_per_batch=b)


class World:
    """Nodes and apps; `step(policy)` decides on a snapshot and applies the directives."""

    def __init__(self, nodes: int, mem: int = 16384, vcores: int = 16):
        self.nodes = [NodeView(f"n{i}", "/r", "RUNNING", Resource(mem, vcores), ZERO) for i in range(1, nodes + 1)]
        self.apps: dict[str, App] = {}
        self.now = 1000.0

    def submit(self, app_id: str, t_cpu1: float, t_net: float, **spec: object) -> App:
        """A new app; `spec`: ps-job spec fields (e.g. min_workers) over the default spec."""
        self.now += 1.0
        app = self.apps[app_id] = App(app_id, t_cpu1, t_net, self.now, spec=dict(spec))
        return app

    def finish(self, app_id: str) -> None:
        self.apps[app_id].state = "FINISHED"

    def snapshot(self) -> ClusterSnapshot:
        views = []
        for a in self.apps.values():
            spec = ps_job_view({"app": "mlr", "workers": 1, "servers": 1, "executor_memory_mb": 1024,
                                "executor_vcores": 1, **a.spec})
            views.append(AppView(a.app_id, "default", "alice", a.state, a.submit_time, ZERO,
                                 a.report() if a.state == "RUNNING" else None, spec, am_resource=AM,
                                 directive=a.directive, am_node=a.am_node,
                                 executors=a.executors() if a.state == "RUNNING" else ()))
        total = sum((n.capacity for n in self.nodes), ZERO)
        return ClusterSnapshot(now=self.now, total=total, used=ZERO, nodes=tuple(self.nodes), apps=tuple(views))

    def step(self, policy: Policy) -> Decision:
        decision = policy.decide(self.snapshot())
        for app_id, jd in decision.jobs.items():
            app = self.apps[app_id]
            if not jd.same_as(app.directive):
                version = 1 if app.directive is None else app.directive.version + 1
                app.directive = jd.directive(version)
                app.history.append(app.directive)
        for app in self.apps.values():
            if app.state == "RUNNING" and app.directive is not None and app.directive.workers > 0:
                app.iterations += 10
        self.now += 1.0
        return decision
