"""The `static` policy: what YARN does. Jobs keep the shape they asked for; an empty Decision."""
from __future__ import annotations

from .decision import Decision
from .snapshot import ClusterSnapshot


class StaticPolicy:
    """Never reshapes a job; new jobs wait in their queue until resources free up."""

    name = "static"

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        return Decision()
