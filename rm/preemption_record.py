"""What capacity preemption took from an app or a queue: YARN's counters plus the shrink's (in memory).

YARN's `preemptedResourceMB` / `preemptedResourceVCores` / `numNonAMContainerPreempted` count every
executor taken back for another queue, whichever way: shrunk live by the job, given back by its AM
after a preemption message, or killed. Elastane adds how many of those each way went, and a short
history of notes -- when, why and by how much -- that the app's diagnostics show.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from protocol.records import ZERO, Resource

NOTES_KEPT = 10


@dataclass
class PreemptionRecord:
    """Counters of what was reclaimed (monotonic), and the latest notes."""

    resources: Resource = ZERO
    non_am_containers: int = 0
    am_containers: int = 0          # never non-zero from the reclaim (AMs are never named); kept for YARN's field
    shrunk: int = 0                 # executors given back live by an elastic shrink
    released: int = 0               # named containers the AM gave back before the deadline
    killed: int = 0                 # named containers killed at the deadline
    notes: deque[str] = field(default_factory=lambda: deque(maxlen=NOTES_KEPT))

    def add(self, how: str, resources: Resource, containers: int) -> None:
        """Count `containers` executors holding `resources` taken back `how` (shrink / released / killed)."""
        if how not in ("shrink", "released", "killed"):
            raise ValueError(f"unknown way of preemption {how!r}")
        self.resources = self.resources + resources
        self.non_am_containers += containers
        if how == "shrink":
            self.shrunk += containers
        elif how == "released":
            self.released += containers
        else:
            self.killed += containers

    def note(self, at: float, text: str) -> None:
        """Keep `text`, stamped with `at` (seconds since the epoch, UTC)."""
        self.notes.append(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(at))} UTC: {text}")

    def to_json(self) -> dict[str, object]:
        return {"preemptedResourceMB": self.resources.memory, "preemptedResourceVCores": self.resources.vcores,
                "numNonAMContainerPreempted": self.non_am_containers,
                "numAMContainerPreempted": self.am_containers}


__all__ = ["NOTES_KEPT", "PreemptionRecord"]
