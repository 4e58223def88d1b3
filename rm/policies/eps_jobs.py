"""The EPS H-scheduler's view of a cluster snapshot: running elastic jobs, incoming jobs, the rest.

A PS job (an app with a typed spec, `AppView.ps`) is *running* once its AM reports
`started` (protocol.job_report); before that — SUBMITTED, ACCEPTED, or RUNNING while its AM
still gathers executors — it is *incoming* (EPS §4.1's "submitted job"). Any other app with
demand the scheduler has not granted is just "queued": it blocks running-job scheduling (EPS §4:
that mode runs only when "there are available resources but no submitted jobs") but EPS cannot
size it in workers and servers, so it does not shrink jobs for it.

An app (PS or not) whose AM request is held back by its queue's AM resource limit
(`AppView.am_limited`, YARN's "Queue's AM resource limit exceeded") is *held*: it waits in the
queue, so it blocks running-job scheduling like any submitted job, but the scheduler will not
allocate its AM whatever is free, so no job is shrunk for it (see rm/policies/eps.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from protocol.job_report import JobReport
from protocol.records import ZERO, AppState, Resource

from .snapshot import ClusterSnapshot, PSJobView

WAITING_STATES = (AppState.NEW, AppState.NEW_SAVING, AppState.SUBMITTED, AppState.ACCEPTED)


def clamp0(r: Resource) -> Resource:
    """`r` with negative components set to zero."""
    return Resource(max(0, r.memory), max(0, r.vcores))


def units(r: Resource, unit: Resource) -> int:
    """How many `unit`s fit in `r` (on every dimension)."""
    counts = []
    if unit.memory > 0:
        counts.append(max(0, r.memory) // unit.memory)
    if unit.vcores > 0:
        counts.append(max(0, r.vcores) // unit.vcores)
    return min(counts) if counts else 0


@dataclass(frozen=True)
class RunningJob:
    """A started elastic PS job. `workers` / `servers` are its target: the directive it is heading
    to if there is one (`AppView.heading_to`: the AM is moving to it), else what the AM reports."""

    app_id: str
    submit_time: float
    workers: int
    servers: int
    spec: PSJobView
    executor: Resource
    am: Resource
    held: Resource
    report: JobReport

    @property
    def order(self) -> tuple[float, str]:
        return (self.submit_time, self.app_id)

    def footprint(self, workers: int, servers: int) -> Resource:
        """What the job holds once it has `workers` and `servers` (AM included)."""
        return self.am + self.executor.scale(workers + servers)


@dataclass(frozen=True)
class IncomingJob:
    """A PS job still waiting for (part of) what it asked for."""

    app_id: str
    submit_time: float
    workers: int
    servers: int
    executor: Resource
    am: Resource
    held: Resource
    report: Optional[JobReport]

    @property
    def am_granted(self) -> bool:
        return self.am.fits_in(self.held) and self.held != ZERO

    @property
    def need(self) -> Resource:
        """What the job still lacks: its AM (if not granted) and its outstanding executors."""
        return clamp0(self.am + self.executor.scale(self.workers + self.servers) - self.held)

    def outstanding(self) -> tuple[int, int]:
        """(workers, servers) not yet granted. Counted from what the RM has granted (the AM's report
        lags behind its grants); the executors held are spread over the roles in the submitted ratio."""
        granted = units(self.held - self.am, self.executor) if self.am_granted else 0
        granted = min(granted, self.workers + self.servers)
        got_s = min(self.servers, granted * self.servers // (self.workers + self.servers))
        got_w = min(self.workers, granted - got_s)
        return self.workers - got_w, self.servers - got_s


@dataclass(frozen=True)
class EpsView:
    """A snapshot sorted for the H-scheduler (every list in (submit_time, app_id) order)."""

    running: tuple[RunningJob, ...]
    incoming: tuple[IncomingJob, ...]
    other_queued: tuple[str, ...]
    free: Resource
    held: tuple[str, ...] = ()      # apps whose AM the queue's AM limit holds back (waiting, not startable)

    @property
    def queued(self) -> bool:
        """Something waits in a queue (EPS §4: running-job scheduling only runs when nothing does)."""
        return bool(self.incoming or self.other_queued or self.held)

    @property
    def startable_waiting(self) -> bool:
        """Something waits that freed resources could go to (the scheduler may allocate to it)."""
        return bool(self.incoming or self.other_queued)


def classify(snapshot: ClusterSnapshot) -> EpsView:
    """Split the snapshot's apps into running elastic jobs, incoming PS jobs and other queued apps."""
    running: list[RunningJob] = []
    incoming: list[IncomingJob] = []
    other: list[str] = []
    held: list[str] = []
    for app in sorted(snapshot.apps, key=lambda a: (a.submit_time, a.app_id)):
        if app.state.is_final:
            continue
        if app.am_limited:
            # Its AM cannot be allocated until the queue's AM limit admits it (e.g. another AM in the
            # queue finishes). A job whose AM request waits has no AM to direct, whatever it last reported.
            held.append(app.app_id)
            continue
        spec = app.ps
        report = app.shape
        if spec is None:
            if app.state in WAITING_STATES or app.pending != ZERO:
                other.append(app.app_id)
            continue
        executor = (report.executor_resource if report is not None and report.executor_resource is not None
                    else spec.executor)
        if app.started and report is not None:
            d = app.heading_to
            workers, servers = (d.workers, d.servers) if d is not None else (report.workers, report.servers)
            running.append(RunningJob(app.app_id, app.submit_time, workers, servers, spec, executor,
                                      app.am_resource, app.resources, report))
        else:
            job = IncomingJob(app.app_id, app.submit_time, spec.workers, spec.servers, executor,
                              app.am_resource, app.resources, report)
            # A job holding all it asked for whose AM does not (yet) say `started` waits for nothing:
            # it is neither managed nor queued (an AM that never reports `started` must not block growth).
            if app.state != AppState.RUNNING or job.need != ZERO:
                incoming.append(job)
    return EpsView(tuple(running), tuple(incoming), tuple(other), snapshot.total - snapshot.used, tuple(held))


__all__ = ["EpsView", "IncomingJob", "RunningJob", "clamp0", "classify", "units"]
