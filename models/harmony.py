"""Harmony's performance model, dissertation eq. 4.1-4.4 (the `harmony` policy and its benchmark).

A job j is profiled as the 3-tuple (T_cpu_j, T_net_j, c_g): the mean time of its COMP subtask and
of its COMM (PULL + PUSH) subtasks per iteration, measured on the c_g machines of its group. COMP
parallelises over the group's machines (eq. 4.2, T_cpu ∝ 1/m_g) while COMM stays about the same, so
the model keeps T_cpu normalised to ONE machine (`t_cpu1 = T_cpu * c_g`) and evaluates it at any m:

    T_cpu_j(m)  = t_cpu1_j / m                                             (4.2)
    T_itr_j     = T_cpu_j + T_net_j          (a job alone: COMP then COMM)
    Tg_itr_g    = max( sum_j T_cpu_j, sum_j T_net_j, max_j T_itr_j )        (4.1)
    U(g)        = [ sum_j T_cpu_j / Tg_itr_g,  sum_j T_net_j / Tg_itr_g ]   (4.3)
    U           = sum_g m_g U(g) / sum_g m_g                                (4.4)

The first two terms of eq. 4.1 are the resource-bound cases (the arbiter runs one COMP and one
primary COMM at a time per node, so a group's subtasks of one kind queue behind each other), the
third the job-bound case (one long job holds the group's iteration back).

**Threads and cores.** The paper assumes a COMP uses all of a machine's cores, so COMPs of a group
run one at a time and their times add up. Here a node's arbiter holds a pool of `cores` and a COMP
asks for the `threads` it uses (nodemanager/arbiter.py): COMPs whose threads fit run side by side.
The model then treats the CPU as a resource of capacity `cores` that a COMP occupies for T_cpu_j
at a share s_j = min(threads_j, cores) / cores, T_cpu_j being its time *with* those threads (the
held time the executors report, protocol/job_report.py):

    CPU term of (4.1)   sum_j s_j T_cpu_j            U_cpu of (4.3)   sum_j s_j T_cpu_j / Tg_itr_g

(`cpu_share`; the functions take `share`, default 1 = the paper's case, where it changes
nothing). It assumes a COMP's threads keep its cores busy the whole COMP (no serial part: a
COMP that is partly serial makes the model pessimistic about packing) and that COMPs sharing the
pool do not slow each other beyond their shares (no memory-bandwidth interference).

**COMM across the link (departure from eq. 4.2).** The paper keeps T_net constant in m: its jobs
move GBs, profiled on the cluster's own network. Here a job is profiled on ONE node, its worker
and its server talking over loopback, and the models are MBs pulled and pushed whole every
mini-batch on capped links (the testbed: 100 Mbit/s), so the profiled COMM is far below what the
job pays once its group spans m >= 2 hosts. With one worker and one server of the job per node
(Harmony's placement) a worker's model blocks are spread over m servers, so a fraction (m-1)/m
of every pull and push crosses the host's link:

    T_net_j(m)  = t_net_local_j + t_link_j * (m - 1) / m                   (`net_time`)

t_link_j = the bytes a worker moves per mini-batch (pull + push) / the node's link bandwidth, the
time the whole exchange would take if all of it crossed the link; t_net_local_j the rest (what
the job pays on loopback). Every T_net_j above is T_net_j(m_g) of its group's m_g; t_link = 0
(an unknown bandwidth, or no bytes measured) is the paper's model exactly. The functions take
`t_link` per job, default zeros. It assumes one job's workers do not share a link's bandwidth with
its partners' transfers beyond the arbiter's one primary COMM per node (which serialises them).

The dissertation compares groupings by U but says CPU "is treated more importantly than the network
utilization"; `score` makes that a number: a weighted sum with `CPU_WEIGHT` on CPU.

Everything is numpy and vectorised over jobs: a grouping is `group_of` (per job its group index,
-1 = not running) plus `machines` (per group its m_g), so a cluster of thousands of groups is
evaluated in a few array passes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from protocol.errors import PlanningError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

CPU_WEIGHT = 2.0 / 3.0      # the weight of CPU utilization in `score` (network gets the rest)


class ModelError(PlanningError, ValueError):
    """Inputs the model cannot evaluate (negative times, a group without machines...)."""


def cpu_time(t_cpu1: FloatArray | float, machines: FloatArray | float) -> FloatArray:
    """Eq. 4.2: the COMP time on `machines` machines of a job whose COMP takes `t_cpu1` on one."""
    return np.asarray(t_cpu1, dtype=np.float64) / np.asarray(machines, dtype=np.float64)


def normalise_cpu(t_cpu: float, machines: int) -> float:
    """The inverse of eq. 4.2: a COMP time measured on `machines` machines, as on one machine."""
    if machines < 1:
        raise ModelError(f"a profile needs at least one machine, got {machines}")
    return t_cpu * machines


def net_time(t_net_local: FloatArray | float, t_link: FloatArray | float,
             machines: FloatArray | float) -> FloatArray:
    """T_net(m) = t_net_local + t_link (m - 1) / m: a job's COMM on `machines` machines, the share
    (m-1)/m of its exchange that goes to other hosts' servers crossing the link (module doc)."""
    m = np.asarray(machines, dtype=np.float64)
    if np.any(m < 1):
        raise ModelError("a job runs on at least one machine")
    out: FloatArray = (np.asarray(t_net_local, dtype=np.float64)
                       + np.asarray(t_link, dtype=np.float64) * (m - 1.0) / m)
    return out


def link_time(bytes_per_batch: float, link_bandwidth_bps: float) -> float:
    """t_link: the seconds a worker's whole exchange per mini-batch (`bytes_per_batch`, pull +
    push) takes on a link of `link_bandwidth_bps` bits/s; 0 when either is unknown (<= 0)."""
    if bytes_per_batch <= 0.0 or link_bandwidth_bps <= 0.0:
        return 0.0
    return float(bytes_per_batch) * 8.0 / float(link_bandwidth_bps)


def best_machines(t_cpu1: float, t_net_local: float, t_link: float, max_machines: int) -> int:
    """The m in 1..max_machines minimising a job's own iteration t_cpu1/m + T_net(m) (ties: fewer).

    t_cpu1/m + t_net_local + t_link (m-1)/m = t_net_local + t_link + (t_cpu1 - t_link)/m, so more
    machines help exactly when one machine's COMP exceeds the link time of the whole exchange:
    then all of them, else one."""
    if max_machines < 1:
        raise ModelError(f"max_machines must be >= 1, got {max_machines}")
    if t_cpu1 < 0 or t_net_local < 0 or t_link < 0:
        raise ModelError("subtask times must be non-negative")
    return int(max_machines) if t_cpu1 > t_link else 1


def cpu_share(threads: FloatArray | float, cores: FloatArray | float) -> FloatArray:
    """s_j: the share of a node's CPU pool of `cores` that a COMP using `threads` threads holds
    (at most 1: the arbiter grants a request for more than the pool the whole pool)."""
    t = np.asarray(threads, dtype=np.float64)
    c = np.asarray(cores, dtype=np.float64)
    if np.any(t < 1) or np.any(c < 1):
        raise ModelError("threads and cores must be >= 1")
    out: FloatArray = np.minimum(t, c) / c
    return out


def job_iteration_time(t_cpu: FloatArray | float, t_net: FloatArray | float) -> FloatArray:
    """A job's own iteration: its COMP then its COMM (T_itr_j)."""
    return np.asarray(t_cpu, dtype=np.float64) + np.asarray(t_net, dtype=np.float64)


def group_iteration_time(t_cpu: FloatArray, t_net: FloatArray, share: FloatArray | float = 1.0) -> float:
    """Eq. 4.1 for one group, its members' COMP and COMM times already at the group's m_g (COMM:
    `net_time`); `share`: each
    COMP's share of the node's cores (`cpu_share`; 1 = it holds the machine, as in the paper)."""
    t_cpu = np.asarray(t_cpu, dtype=np.float64)
    t_net = np.asarray(t_net, dtype=np.float64)
    if t_cpu.size == 0:
        return 0.0
    cpu = float(np.sum(t_cpu * np.asarray(share, dtype=np.float64)))
    return float(max(cpu, t_net.sum(), (t_cpu + t_net).max()))


def group_utilization(t_cpu: FloatArray, t_net: FloatArray, share: FloatArray | float = 1.0) -> FloatArray:
    """Eq. 4.3 for one group: [U_cpu, U_net] (zeros for an empty or idle group); `share` as in
    `group_iteration_time`."""
    t_itr = group_iteration_time(t_cpu, t_net, share)
    if t_itr <= 0.0:
        return np.zeros(2)
    cpu = np.sum(np.asarray(t_cpu, dtype=np.float64) * np.asarray(share, dtype=np.float64))
    return np.array([cpu / t_itr, np.sum(t_net) / t_itr])


def cluster_utilization(machines: IntArray | FloatArray, utils: FloatArray) -> FloatArray:
    """Eq. 4.4: the groups' [U_cpu, U_net] (rows of `utils`) weighted by their machines."""
    m = np.asarray(machines, dtype=np.float64)
    if m.size == 0 or m.sum() <= 0:
        return np.zeros(2)
    out: FloatArray = (m[:, None] * np.asarray(utils, dtype=np.float64).reshape(-1, 2)).sum(axis=0) / m.sum()
    return out


def score(u: FloatArray, cpu_weight: float = CPU_WEIGHT) -> float:
    """One number to compare utilizations by: CPU weighted `cpu_weight`, network the rest."""
    return float(cpu_weight * u[0] + (1.0 - cpu_weight) * u[1])


@dataclass(frozen=True)
class GroupStats:
    """Eq. 4.1-4.3 for every group of a grouping at once (arrays indexed by group)."""

    cpu: FloatArray         # sum_j s_j T_cpu_j(m_g) (s_j = 1: the paper's one COMP per machine)
    net: FloatArray         # sum_j T_net_j(m_g)
    max_job: FloatArray     # max_j T_itr_j(m_g)
    machines: FloatArray

    @property
    def iteration_time(self) -> FloatArray:
        """Eq. 4.1 per group."""
        out: FloatArray = np.maximum(np.maximum(self.cpu, self.net), self.max_job)
        return out

    @property
    def utilization(self) -> FloatArray:
        """Eq. 4.3 per group: shape (groups, 2); an empty group's row is zero."""
        t = self.iteration_time
        safe = np.where(t > 0.0, t, 1.0)
        out: FloatArray = np.stack([self.cpu / safe, self.net / safe], axis=1) * (t > 0.0)[:, None]
        return out

    @property
    def job_bound(self) -> npt.NDArray[np.bool_]:
        """Groups whose longest job, not a resource, sets the iteration time (Fig. 4.7b)."""
        out: npt.NDArray[np.bool_] = self.max_job > np.maximum(self.cpu, self.net)
        return out

    def cluster(self) -> FloatArray:
        """Eq. 4.4 over these groups."""
        return cluster_utilization(self.machines, self.utilization)


def group_stats(t_cpu1: FloatArray, t_net: FloatArray, group_of: IntArray, machines: IntArray,
                share: FloatArray | float = 1.0, t_link: FloatArray | float = 0.0) -> GroupStats:
    """Eq. 4.1-4.3 of every group of the grouping (`group_of[j]` = job j's group, -1: not running;
    `machines[g]` = m_g >= 1; `share[j]` = job j's COMP share of a node's cores; `t_net[j]` its
    COMM on one machine (t_net_local) and `t_link[j]` its link time, T_net_j = `net_time` at m_g;
    see the module doc)."""
    t_cpu1 = np.asarray(t_cpu1, dtype=np.float64)
    t_net = np.asarray(t_net, dtype=np.float64)
    link = np.broadcast_to(np.asarray(t_link, dtype=np.float64), t_net.shape)
    group_of = np.asarray(group_of, dtype=np.int64)
    m = np.asarray(machines, dtype=np.float64)
    if np.any(t_cpu1 < 0) or np.any(t_net < 0) or np.any(link < 0):
        raise ModelError("subtask times must be non-negative")
    n_groups = m.size
    running = group_of >= 0
    g = group_of[running]
    if np.any(g >= n_groups):
        raise ModelError(f"a job names group {int(g.max())} of {n_groups}")
    if np.any(m[np.unique(g)] < 1):
        raise ModelError("a group with jobs needs at least one machine")
    m_j = np.where(m[g] > 0, m[g], 1.0)
    cpu_j = t_cpu1[running] / m_j
    net_j = net_time(t_net[running], link[running], m_j)
    share_j = np.broadcast_to(np.asarray(share, dtype=np.float64), t_cpu1.shape)[running]
    cpu = np.bincount(g, weights=cpu_j * share_j, minlength=n_groups).astype(np.float64)
    net = np.bincount(g, weights=net_j, minlength=n_groups).astype(np.float64)
    max_job = np.zeros(n_groups)
    np.maximum.at(max_job, g, cpu_j + net_j)
    return GroupStats(cpu, net, max_job, m)


def utilization(t_cpu1: FloatArray, t_net: FloatArray, group_of: IntArray, machines: IntArray,
                t_link: FloatArray | float = 0.0) -> FloatArray:
    """Eq. 4.4 of a grouping: the cluster's [U_cpu, U_net] (`t_link` as in `group_stats`)."""
    return group_stats(t_cpu1, t_net, group_of, machines, t_link=t_link).cluster()


__all__ = ["CPU_WEIGHT", "GroupStats", "ModelError", "best_machines", "cluster_utilization", "cpu_share",
           "cpu_time", "group_iteration_time", "group_stats", "group_utilization", "job_iteration_time",
           "link_time", "net_time", "normalise_cpu", "score", "utilization"]
