"""The `static` policy: what YARN does. Jobs keep the shape they asked for; no directives."""
from __future__ import annotations

from protocol.internal_api import ShapeDirective

from .snapshot import ClusterSnapshot


class StaticPolicy:
    """Never reshapes a job; new jobs wait in their queue until resources free up."""

    name = "static"

    def decide(self, snapshot: ClusterSnapshot) -> dict[str, ShapeDirective]:
        return {}
