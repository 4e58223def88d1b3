"""The policy's resync after an RM restart or failover: hold its rounds until the cluster it decided
over is back, then count the reshapes of its first rounds (pure, no I/O).

A new active RM recovers its apps, their latest directives and the policy's own state from the
store (rm/store.py `PolicyStateRecord`), but the cluster comes back to it piecemeal: NMs re-register
one by one, AMs register again and send their first job reports a heartbeat later. A policy that
decided meanwhile would see nodes and jobs missing and reshape jobs for a cluster that has not
changed (YARN's work-preserving recovery likewise lets the scheduler wait for the NMs, its
`work-preserving-recovery.scheduling-wait-ms`). So the rounds are held until

* every node the policy last decided over (the record's `nodes`) has registered again,
* every kept attempt's AM has registered again and allocated since -- a PS job's with a job report,
  from which the policy refits what it did not store (Optimus's curves) -- or its attempt ended,

or `deadline` passes (a node that has not re-registered by then is as lost as the old RM would have
found it: the cluster changed). The first `WINDOW` rounds after that count `reshapes`: directives
that change a running job's shape (workers, servers, placement, run state or executor size) --
the issue's `reshapes_after_failover`, 0 unless the cluster changed (`cluster_changed` says whether
it did: nodes missing or new when the hold ended).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from protocol.internal_api import ShapeDirective
from protocol.job_report import JobReport

from .policies.decision import JobDecision

WINDOW = 3      # policy rounds after the hold whose reshapes are counted


@dataclass
class PolicyResync:
    """One recovery's hold and count (see the module doc). `attempts`: the attempts kept;
    `nodes`: the RUNNING nodes of the policy's last stored state."""

    started_at: float
    deadline: float
    attempts: frozenset[str]
    nodes: frozenset[str]
    held_rounds: int = 0
    released_at: Optional[float] = None
    released_why: str = ""
    rounds: int = 0             # counted rounds since the release (up to WINDOW)
    reshapes: int = 0
    cluster_changed: bool = False
    waiting_for: list[str] = field(default_factory=list)   # as of the last check, for operators

    @property
    def holding(self) -> bool:
        return self.released_at is None

    @property
    def counting(self) -> bool:
        return self.released_at is not None and self.rounds < WINDOW

    def release(self, now: float, why: str, running_nodes: frozenset[str]) -> None:
        self.released_at, self.released_why = now, why
        self.cluster_changed = running_nodes != self.nodes
        self.waiting_for = []

    def info(self) -> dict[str, object]:
        """For /ws/v1/cluster/info (`policyResync`)."""
        state = "HOLDING" if self.holding else "COUNTING" if self.counting else "DONE"
        return {"state": state, "waitingFor": list(self.waiting_for), "heldRounds": self.held_rounds,
                "countedRounds": self.rounds, "reshapesAfterFailover": self.reshapes,
                "clusterChanged": self.cluster_changed, "released": self.released_why}


def reshapes(jd: JobDecision, before: Optional[ShapeDirective], report: Optional[JobReport]) -> bool:
    """Whether directive `jd` changes the job's shape: against its previous directive, or -- it had
    none -- against the shape its AM reports (the group and reason alone are no reshape)."""
    if before is not None:
        return (jd.workers, jd.servers, list(jd.placement), jd.run_state, jd.executor_resource) != (
            before.workers, before.servers, before.placement, before.run_state, before.executor_resource)
    if report is None:
        return True
    return (jd.workers, jd.servers) != (report.workers, report.servers)


__all__ = ["PolicyResync", "WINDOW", "reshapes"]
