"""Harmony's job profiles: the 3-tuple (T_cpu, T_net, c_g) per job from its AM's job reports.

A PS AM reports, on every allocate, its workers' per-iteration COMP and COMM times (moving averages
over its own workers; protocol/job_report.py `worker_times`). Each report that shows new iterations
taken in a steady shape (the AM has acted on its latest directive and is not reconfiguring, so the
times belong to the machines it is told to have) is one sample (T_cpu, T_net, c_g) with c_g = the
workers measured: under Harmony a job runs one worker on each node of its group, so that is its
machines. The profile keeps COMP normalised to one machine (eq. 4.2, models/harmony.py) and both
times as exponential moving averages over the samples (dissertation §4.3.2: "updated using moving
averages for up-to-date information").

The times are those the subtasks *held* their arbiter grants (`compute_held_s`, `comm_held_s`),
not the time they took including the wait for a grant: co-located, a job's COMP waits while its
partners' COMPs hold the CPU, and a profile that counted the wait would absorb them (§4.3.2:
"individual subtasks are executed in isolation from other subtasks", so what a subtask holds is
its own cost). A report without held times (an AM older than them, or a job that does not run
through the arbiter) says only the whole time, which is the job's own only when it runs alone:
`update(..., alone=False)` then leaves the profile as it is.

COMM is kept as two parts (models/harmony.py, `net_time`: T_net(m) = t_net_local + t_link (m-1)/m,
a departure from eq. 4.2): t_link = the report's `bytes_per_batch` (a worker's pull + push) over
the link bandwidth (`link_bandwidth_bps`, the policy's config; 0 = unknown: t_link 0, the paper's
model), and t_net_local = T_net less the share (c_g-1)/c_g of t_link the sample paid on the link
(at least 0). Both are moving averages; a sample without bytes keeps the profile's t_link.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from models.harmony import link_time, net_time, normalise_cpu
from protocol.job_report import JobReport

EMA_WEIGHT = 0.3        # the weight of a new sample in the moving averages


@dataclass(frozen=True)
class Profile:
    """A job's profile per iteration (seconds): COMP on one machine, COMM on one machine
    (`t_net_local`) and the link time of its whole exchange (`t_link`, module doc)."""

    t_cpu1: float
    t_net_local: float
    machines: int           # c_g of the latest sample
    samples: int
    iterations: int         # the report's `iterations` at the latest sample
    t_link: float = 0.0

    def at(self, machines: float) -> tuple[float, float]:
        """(T_cpu, T_net) on `machines` machines (eq. 4.2; COMM: `net_time`)."""
        return self.t_cpu1 / machines, self.net(machines)

    def net(self, machines: float) -> float:
        """T_net on `machines` machines: t_net_local + t_link (m-1)/m."""
        return float(net_time(self.t_net_local, self.t_link, machines))


@dataclass(frozen=True)
class Sample:
    """One report's (T_cpu, T_net, c_g) and a worker's bytes per mini-batch (0: not counted);
    `held`: the times are held grant times (not waited)."""

    t_cpu: float
    t_net: float
    machines: int
    held: bool
    bytes_per_batch: float = 0.0


def sample(report: JobReport) -> Optional[Sample]:
    """The report's sample -- held times where the report has them, else the whole times -- or None
    while it has no timings."""
    wt = report.worker_times
    if wt.workers < 1 or (wt.compute_s <= 0.0 and wt.comm_s <= 0.0):
        return None
    if wt.compute_held_s > 0.0 or wt.comm_held_s > 0.0:
        return Sample(wt.compute_held_s, wt.comm_held_s, wt.workers, True, wt.bytes_per_batch)
    return Sample(wt.compute_s, wt.comm_s, wt.workers, False, wt.bytes_per_batch)


def update(profile: Optional[Profile], report: JobReport, ema_weight: float = EMA_WEIGHT,
           alone: bool = True, link_bandwidth_bps: float = 0.0) -> Optional[Profile]:
    """`profile` with the report's sample folded in (unchanged when the report has no timings, no
    iterations since the last sample, or only whole times of a job that is not `alone`);
    `link_bandwidth_bps`: the nodes' link (bits/s, 0: unknown, no link term)."""
    s = sample(report)
    # The AM's moving averages move only with iterations; fewer iterations than the last sample
    # mean a new AM attempt counting afresh, whose report is a sample too.
    if s is None or (profile is not None and report.iterations == profile.iterations):
        return profile
    if not s.held and not alone:
        return profile          # its waits for partners' grants are in these times
    machines = s.machines
    t1 = normalise_cpu(s.t_cpu, machines)
    link = link_time(s.bytes_per_batch, link_bandwidth_bps)
    if link <= 0.0 and profile is not None:
        link = profile.t_link       # no bytes in this report (or no bandwidth): the link as it was
    # What the sample paid on the link, (c_g-1)/c_g of the whole exchange, is not local COMM.
    local = max(0.0, s.t_net - link * (machines - 1) / machines)
    if profile is None:
        return Profile(t1, local, machines, 1, report.iterations, link)
    a = ema_weight
    return Profile((1.0 - a) * profile.t_cpu1 + a * t1, (1.0 - a) * profile.t_net_local + a * local, machines,
                   profile.samples + 1, report.iterations, (1.0 - a) * profile.t_link + a * link)


class ProfileBook:
    """The profiles of the jobs the policy tracks (app id -> Profile)."""

    def __init__(self, ema_weight: float = EMA_WEIGHT, link_bandwidth_bps: float = 0.0):
        self.ema_weight = ema_weight
        self.link_bandwidth_bps = link_bandwidth_bps     # the nodes' link, bits/s (0: unknown)
        self.profiles: dict[str, Profile] = {}

    def observe(self, app_id: str, report: Optional[JobReport], alone: bool = True) -> Optional[Profile]:
        """Fold a steady report of `app_id` in (`alone`: no other job's executors share its nodes);
        returns its profile (None: not profiled yet)."""
        old = self.profiles.get(app_id)
        if report is None:
            return old
        new = update(old, report, self.ema_weight, alone, self.link_bandwidth_bps)
        if new is not None:
            self.profiles[app_id] = new
        return new

    def get(self, app_id: str) -> Optional[Profile]:
        return self.profiles.get(app_id)

    def forget(self, app_id: str) -> None:
        self.profiles.pop(app_id, None)


__all__ = ["EMA_WEIGHT", "Profile", "ProfileBook", "Sample", "sample", "update"]
