"""What the simulator records of one job: arrival, AM start, training start, end, shape over time."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class JobRecord:
    """What the simulator reports of one job (times in seconds from the start of the run)."""

    name: str
    app: str
    user: str
    queue: str
    app_id: str = ""
    arrival: float = 0.0
    am_start: Optional[float] = None        # AM registered
    start: Optional[float] = None           # training began (all executors up)
    end: Optional[float] = None             # AM unregistered
    epochs: int = 0
    target_epochs: int = 0
    reshapes: int = 0
    pauses: int = 0
    final_status: str = ""
    shapes: list[tuple[float, int, int]] = field(default_factory=list)   # (time, workers, servers)

    @property
    def jct(self) -> Optional[float]:
        """Arrival to end, for a job that SUCCEEDED; None otherwise. A failed or killed job's end
        is no completion (its short 'JCT' would flatter the policy that lost it): it is counted
        apart (`failed`), never averaged in."""
        if self.end is None or self.final_status != "SUCCEEDED":
            return None
        return self.end - self.arrival

    @property
    def failed(self) -> bool:
        """It ended without succeeding (FAILED or KILLED)."""
        return self.end is not None and self.final_status != "SUCCEEDED"

    def to_json(self, t0: float) -> dict[str, object]:
        def rel(t: Optional[float]) -> Optional[float]:
            return None if t is None else round(t - t0, 3)
        return {"name": self.name, "app": self.app, "app_id": self.app_id, "user": self.user, "queue": self.queue,
                "arrival": rel(self.arrival), "am_start": rel(self.am_start), "start": rel(self.start),
                "end": rel(self.end), "jct": None if self.jct is None else round(self.jct, 3),
                "epochs": self.epochs, "target_epochs": self.target_epochs, "reshapes": self.reshapes,
                "pauses": self.pauses, "final_status": self.final_status,
                "shapes": [[round(t - t0, 3), w, s] for t, w, s in self.shapes]}


__all__ = ["JobRecord"]
