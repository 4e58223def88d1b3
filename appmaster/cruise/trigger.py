"""When the optimizer may decide (dissertation §3.3.1, Optimization Trigger Policy).

No decision until every current worker has reported at least `min_batches` mini-batches since the
last reconfiguration (the first mini-batches of a shape fluctuate until it stabilises, §3.4.1),
and no more often than every `min_interval_s` seconds of the injected clock (a solve per report
would be wasted work). Pure: the caller passes the batch counts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

Clock = Callable[[], float]


@dataclass
class TriggerPolicy:
    """Decides whether enough has been measured to run the optimizer now."""

    min_batches: int = 10
    min_interval_s: float = 30.0
    clock: Clock = field(default=time.monotonic)
    last_attempt: Optional[float] = None
    last_reconfiguration: Optional[float] = None

    def __post_init__(self) -> None:
        if self.min_batches < 1:
            raise ValueError(f"min_batches must be >= 1, got {self.min_batches}")
        if self.min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {self.min_interval_s}")

    def why_not(self, batches_since_reconfiguration: Mapping[str, int]) -> Optional[str]:
        """None if a decision may be taken now, else the reason it may not."""
        if not batches_since_reconfiguration:
            return "no workers"
        short = sorted(w for w, n in batches_since_reconfiguration.items() if n < self.min_batches)
        if short:
            return f"workers {short[:5]}{'...' if len(short) > 5 else ''} have < {self.min_batches} mini-batches"
        if self.last_attempt is not None and self.clock() - self.last_attempt < self.min_interval_s:
            return f"last decision < {self.min_interval_s}s ago"
        return None

    def ready(self, batches_since_reconfiguration: Mapping[str, int]) -> bool:
        return self.why_not(batches_since_reconfiguration) is None

    def attempted(self) -> None:
        """A decision was taken (whether or not it reconfigured)."""
        self.last_attempt = self.clock()

    def reconfigured(self) -> None:
        """A plan finished: counts restart (the caller restarts its metrics too)."""
        self.last_reconfiguration = self.clock()
        self.last_attempt = self.last_reconfiguration
