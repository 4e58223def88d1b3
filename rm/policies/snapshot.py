"""The cluster snapshot a policy decides on: plain, immutable data (the simulator builds the same).

A PS job's submitted spec reaches the policies typed: `AppView.ps` is the app's `PSJobView`, which
the RM builds once (`ps_job_view`) from the `PSJobSpec` it decoded at submission (or on recovery)
and keeps in its app record (rm/model.py `App.ps`), so no policy round parses a spec. Its
progress and phase are the AM's latest `JobReport` (`AppView.shape`). App and node states are the
`AppState` / `NodeState` enums.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional, Union, overload

import msgspec

from protocol import ps_job_spec
from protocol.internal_api import NodePlacement, ShapeDirective
from protocol.job_report import JobReport
from protocol.records import ZERO, AppState, NodeState, Resource


@dataclass(frozen=True)
class PSJobView:
    """A PS job's spec as the policies read it (protocol.ps_job_spec, defaults applied).

    `executor` is one executor's resource as the scheduler grants it (memory rounded up to the
    minimum allocation); `max_epochs` / `convergence_threshold` are the job's effective ones (the
    spec's overrides over the app's hyper-parameters and preset; None where unknown, e.g. a user
    app that sets none). `spec` is the whole typed spec for anything else."""

    spec: ps_job_spec.PSJobSpec
    app: str
    workers: int                 # the submitted shape (what the AM starts with)
    servers: int
    min_workers: int             # bounds for elastic scaling (max_* default to the submitted shape)
    max_workers: int
    min_servers: int
    max_servers: int
    weight: float                # Dorm's w / (weighted) DRF's weight
    executor: Resource
    bsp: bool                    # sync == "bsp"
    max_epochs: Optional[int] = None
    convergence_threshold: Optional[float] = None
    early_feedback_iterations: int = 100

    @property
    def n_min(self) -> int:
        """Dorm's n_min: the fewest executors the job runs with."""
        return self.min_workers + self.min_servers

    @property
    def n_max(self) -> int:
        """Dorm's n_max: the most executors the job may be given."""
        return self.max_workers + self.max_servers


@overload
def ps_job_view(spec: ps_job_spec.PSJobSpec, minimum_allocation_mb: int = 1) -> PSJobView: ...
@overload
def ps_job_view(spec: Mapping[str, object], minimum_allocation_mb: int = 1) -> Optional[PSJobView]: ...


def ps_job_view(spec: Union[ps_job_spec.PSJobSpec, Mapping[str, object]],
                minimum_allocation_mb: int = 1) -> Optional[PSJobView]:
    """The policies' view of a PS job spec, with the executor memory rounded up to the scheduler's
    `minimum_allocation_mb` step. The RM passes the `PSJobSpec` it decoded at submission; builders
    of snapshots outside the RM (tests, benches, the simulator's traces) may pass the spec's JSON
    object, which is decoded here (None when it is not a spec)."""
    if not isinstance(spec, ps_job_spec.PSJobSpec):
        try:
            spec = msgspec.convert(spec, ps_job_spec.PSJobSpec, strict=False)
        except msgspec.ValidationError:
            return None
    try:    # the app's decoded hyper-parameters, kept on the spec (decoded at most once)
        max_epochs, threshold = spec.effective_max_epochs, spec.effective_convergence_threshold
    except ps_job_spec.JobSpecError:    # a stored spec this app's schema no longer reads
        max_epochs, threshold = spec.max_epochs, spec.convergence_threshold
    step = max(1, minimum_allocation_mb)
    mem = -(-spec.executor_memory_mb // step) * step     # as the scheduler normalises the asks
    return PSJobView(spec=spec, app=spec.app, workers=spec.workers, servers=spec.servers,
                     min_workers=spec.min_workers, max_workers=spec.max_workers or spec.workers,
                     min_servers=spec.min_servers, max_servers=spec.max_servers or spec.servers,
                     weight=spec.weight, executor=Resource(mem, spec.executor_vcores), bsp=spec.sync == "bsp",
                     max_epochs=max_epochs, convergence_threshold=threshold,
                     early_feedback_iterations=spec.early_feedback_iterations)


@dataclass(frozen=True)
class NodeView:
    node_id: str
    rack: str
    state: NodeState
    capacity: Resource
    used: Resource
    # Of `used`, the containers already released that the node still holds until its NM confirms
    # them gone (rm/core.py `_release`): free within a heartbeat, so a policy planning a partition
    # counts them as room -- else every shrink briefly hides room and the fair shares flip back
    # and forth (rm/policies/elastic_jobs.py).
    releasing: Resource = ZERO

    def __post_init__(self) -> None:
        # Builders outside the RM (tests, benches) may pass the state's name.
        object.__setattr__(self, "state", NodeState(self.state))


@dataclass(frozen=True)
class AppView:
    app_id: str
    queue: str
    user: str
    state: AppState
    submit_time: float
    resources: Resource                 # currently allocated to the app
    shape: Optional[JobReport] = None   # the AM's latest job report: progress, phase, timings
    ps: Optional[PSJobView] = None      # the PS job's typed spec (None: not a PS job)
    am_resource: Resource = ZERO        # the AM container's resource (held once the AM is allocated)
    pending: Resource = ZERO            # demand the scheduler has not granted yet (AM + open asks)
    directive: Optional[ShapeDirective] = None   # the latest directive the RM holds for the app
    # The app's AM request waits for activation by its queue's AM resource limit (rm/am_limit.py):
    # the scheduler will not allocate its AM whatever is free, so freeing resources cannot start it.
    am_limited: bool = False
    # Where the app's executors (its non-AM containers) run now: per node, how many are tagged
    # "worker" and "server" (the PS AM tags its asks with the role; other tags count as workers).
    executors: tuple[NodePlacement, ...] = ()
    # The same containers by the resources they hold per node (node id, resources), in node order:
    # Optimus frees a reshaped job's own executors before placing it anew (containers of one job
    # may differ in size, which the role counts above do not say).
    executors_on: tuple[tuple[str, Resource], ...] = ()
    # The node the AM container runs on (None until it is allocated): the scheduler packs AMs, so a
    # policy that sizes executors to fill nodes must leave each node's actual AMs their room.
    am_node: Optional[str] = None

    def __post_init__(self) -> None:
        # Builders outside the RM (tests, benches) may pass the state's name.
        object.__setattr__(self, "state", AppState(self.state))

    @property
    def started(self) -> bool:
        """The app runs and its AM has reported that training began (JobReport.started)."""
        return self.state == AppState.RUNNING and self.shape is not None and self.shape.started

    @property
    def heading_to(self) -> Optional[ShapeDirective]:
        """The directive the job is moving to or has reached: the latest one, unless the job
        refused it as a change it cannot make (`JobReport.refused`) -- then none, and a policy
        plans the job at what it holds rather than keep the refused part for it."""
        d = self.directive
        if d is not None and self.shape is not None and self.shape.refused(d.version):
            return None
        return d


# How long an ended app's final status stays in the snapshots (`ClusterSnapshot.ended`): rounds
# run every second or so, so a policy sees each end; the window only bounds the list.
ENDED_WINDOW_S = 600.0

@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a policy may look at; `now` is seconds since the epoch (the RM's clock)."""

    now: float
    total: Resource
    used: Resource
    nodes: tuple[NodeView, ...] = field(default_factory=tuple)
    apps: tuple[AppView, ...] = field(default_factory=tuple)
    minimum_allocation_mb: int = 1      # the scheduler rounds container memory up to a multiple of this
    # The final status ("SUCCEEDED", "FAILED", "KILLED", ...) of the apps that ended in the last
    # ENDED_WINDOW_S: an app that ended is no longer in `apps`, and a policy that learns from a
    # job's end (Optimus's epochs prior) must tell one that ran to its end from one killed.
    ended: Mapping[str, str] = field(default_factory=dict)
