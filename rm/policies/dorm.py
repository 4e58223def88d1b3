"""The `dorm` policy: Dorm's dynamically-partitioned allocation (Dorm §III-C, §IV) for elastic PS jobs.

Each PS job is an application with Dorm's 6-tuple (protocol/ps_job_spec.py: demand vector = one
executor's resource, weight, n_min, n_max; the app and the PS AM are the executor and cmd) and a
partition of the cluster: x_ij executors on node j. When jobs arrive, start or complete (and when
the schedulable nodes change) the utilization-fairness optimizer decides new partitions: the MILP P2
(rm/policies/dorm_milp.py) maximizes utilization with the DRF fairness loss bounded by θ1 and the
number of resized running jobs by θ2 (RMConfig.dorm_fairness_threshold / dorm_adjustment_threshold,
conf/rm.toml). ŝ_i, the DRF share each job would have, comes from weighted DRF progressive filling
on the cluster's aggregate room (rm/policies/drf.py `drf_counts`). When P2 has no feasible
solution every job keeps its allocation until the job set changes again (Dorm §IV-B).

Each resized job gets a JobDecision: its new shape and its executors per node. The AM carries it
out as its job spec says: in place with EPS's operations (elastic_mode "eps"), or with Dorm's own
checkpoint-kill-resume protocol (elastic_mode "kill", appmaster/ps/controller/planners/restart.py; Dorm §III-C-2).

Departures, and why:
* A job that has not started is fixed at its submitted shape (rm/policies/elastic_jobs.py): the PS
  AM starts with exactly what it was submitted with and acts on a directive only once training has
  begun. P2 makes room for it (and for its AM, see dorm_milp.py) and sends it no directive. Dorm
  solves again when it has started ("newly launched", so it does not count in θ2's adjustment
  overhead, eq. 4) and resizes it then: a job is launched at its submitted shape and moved to the
  size Dorm decides, instead of being launched at that size.
* Partitions are computed over the room the jobs' executors share (node capacity less AMs and
  other apps' containers), while shares and utilization are of the whole cluster (Dorm's C_k).
* A solve is bounded in time (`time_limit_s`; the RM runs `decide` in a worker thread, so a long
  solve delays the round, not the RM's event loop) and stops within `mip_rel_gap` of the best
  utilization (1 % by default): the best allocation found by then is used, and none found counts
  as infeasible.
"""
from __future__ import annotations

from typing import Optional

import msgspec
import numpy as np

from protocol.config import RMConfig
from protocol.records import Resource

from .decision import Decision
from .dorm_milp import P2Problem, P2Solution, solve_p2
from .drf import drf_counts
from .elastic_jobs import ElasticView, elastic_view
from .snapshot import ClusterSnapshot

DEFAULT_TIME_LIMIT_S = 2.0
# P2 is a multi-dimensional bin packing at heart: HiGHS finds allocations within a fraction of a
# percent of the LP bound quickly but can take minutes to prove the last 0.1 % (bench/dorm_scale.py).
# Within 1 % of the best utilization is what the policy asks of it by default.
DEFAULT_MIP_REL_GAP = 0.01


def _vec(r: Resource) -> list[float]:
    return [float(r.memory), float(r.vcores)]


def build_problem(view: ElasticView, theta1: float, theta2: float,
                  running_before: Optional[frozenset[str]] = None) -> P2Problem:
    """P2 for the view's jobs and nodes (x' = where each job's executors are now). The adjustable
    jobs (A^t ∩ A^t-1) are the started ones that were running at the last solve too (`running_before`;
    None: every started job)."""
    jobs, nodes = view.jobs, view.nodes
    index = {n: k for k, n in enumerate(nodes)}
    current = np.zeros((len(jobs), len(nodes)), dtype=int)
    for i, j in enumerate(jobs):
        for node, n in j.current_on().items():
            if node in index:
                current[i, index[node]] = n
    aggregate = Resource(sum(r.memory for r in view.room), sum(r.vcores for r in view.room))
    for j in jobs:
        aggregate = aggregate - j.am
    # The DRF allocation counts each job's AM in its share (drf_counts); P2's shares s_i are of
    # executors (linear in x: Dorm's s_i), so ŝ_i is the executor share of those DRF counts.
    fair = drf_counts(jobs, aggregate, view.total)
    share = np.array([j.demand.dominant_share(view.total) for j in jobs]) * np.array(fair, dtype=float)
    return P2Problem(
        demand=np.array([_vec(j.demand) for j in jobs]).reshape(len(jobs), 2),
        capacity=np.array([_vec(r) for r in view.room]).reshape(len(nodes), 2),
        total=np.array(_vec(view.total)),
        n_min=np.array([j.n_min for j in jobs]), n_max=np.array([j.n_max for j in jobs]),
        fair_share=share, current=current,
        adjustable=np.array([j.started and (running_before is None or j.app_id in running_before) for j in jobs],
                            dtype=bool),
        am=np.array([_vec(j.am) for j in jobs]).reshape(len(jobs), 2), theta1=theta1, theta2=theta2)


class DormState(msgspec.Struct, forbid_unknown_fields=True):
    """What Dorm keeps between rounds, as the RM stores it: the job, running-job and node sets it
    last solved P2 for (a new active RM solves again only when they change, as this one would)."""

    jobs: list[str]
    running: list[str]
    nodes: list[str]


class DormPolicy:
    """Dorm's utilization-fairness optimizer as an Elastane policy (see the module doc). Keeps, between
    calls, the job, running-job and node sets it last solved for (it solves again only when they
    change; the running jobs then are A^t-1)."""

    name = "dorm"

    def __init__(self, fairness_threshold: float = 0.1, adjustment_threshold: float = 0.5,
                 time_limit_s: float = DEFAULT_TIME_LIMIT_S, mip_rel_gap: float = DEFAULT_MIP_REL_GAP):
        for what, v in (("fairness_threshold", fairness_threshold), ("adjustment_threshold", adjustment_threshold)):
            if not 0 <= v <= 1:
                raise ValueError(f"dorm {what} must be in [0, 1], got {v}")
        self.theta1 = fairness_threshold
        self.theta2 = adjustment_threshold
        self.time_limit_s = time_limit_s
        self.mip_rel_gap = mip_rel_gap
        self._solved_for: Optional[tuple[frozenset[str], frozenset[str], tuple[str, ...]]] = None
        self.last_solution: Optional[P2Solution] = None     # for the web UI / tests: the last P2 solved
        self.last_problem: Optional[P2Problem] = None

    def export_state(self) -> Optional[bytes]:
        """The sets last solved for (rm/policies/base.py `export_state`); None before any solve."""
        if self._solved_for is None:
            return None
        jobs, running, nodes = self._solved_for
        return msgspec.json.encode(DormState(sorted(jobs), sorted(running), list(nodes)))

    def restore_state(self, doc: bytes) -> None:
        try:
            st = msgspec.json.decode(doc, type=DormState)
        except msgspec.DecodeError as e:
            raise ValueError(f"dorm policy state: {e}") from None
        self._solved_for = (frozenset(st.jobs), frozenset(st.running), tuple(st.nodes))

    @classmethod
    def from_settings(cls, settings: RMConfig) -> "DormPolicy":
        return cls(settings.dorm_fairness_threshold, settings.dorm_adjustment_threshold)

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        view = elastic_view(snapshot)
        running = frozenset(j.app_id for j in view.started)
        key = (frozenset(j.app_id for j in view.jobs), running, view.nodes)
        if key == self._solved_for or not view.jobs or not view.nodes:
            return Decision()
        before = self._solved_for[1] if self._solved_for is not None else None
        self._solved_for = key
        problem = build_problem(view, self.theta1, self.theta2, before)
        solution = solve_p2(problem, self.time_limit_s, self.mip_rel_gap)
        self.last_problem, self.last_solution = problem, solution
        if solution is None:
            return Decision()       # infeasible: everyone keeps the allocation they have
        out = {}
        per_executor = problem.share_per_executor()
        for i, j in enumerate(view.jobs):
            if not j.started:
                continue
            per_node = {view.nodes[k]: int(n) for k, n in enumerate(solution.x[i]) if n > 0}
            if not view.changed(j, per_node):
                continue
            s = float(per_executor[i] * solution.x[i].sum())
            out[j.app_id] = j.decision(per_node, f"dorm: utilization-fairness optimizer (share {s:.3f}, "
                                                 f"DRF share {problem.fair_share[i]:.3f})")
        return Decision(out)


__all__ = ["DormPolicy", "DormState", "build_problem"]
