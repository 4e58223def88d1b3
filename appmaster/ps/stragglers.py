"""Straggler detection (Optimus §5.2): a worker much slower than its peers is replaced by a new one.

The paper calls a worker a straggler when it runs at less than half the median speed; for
synchronous training, where every worker advances at the same pace, it measures each worker's own
speed from the gaps between its gradients' arrivals. The PS AM already measures each worker's own
per-mini-batch time -- compute plus its push / pull -- as a moving average (appmaster.ps.metrics),
which excludes the time a worker waits at the BSP barrier for the others: that is the speed used
here. A worker is slow when its time exceeds `STRAGGLER_FACTOR` x the median of its peers' times
(the median of the others, so that two workers can tell which one is slow).

To keep a passing hiccup (a co-located burst, a garbage collection) from costing a replacement, the
same worker must be found slow at `CONFIRMATIONS` consecutive checks (the master checks at epoch
ends), over at least `MIN_BATCHES` mini-batches measured for every worker compared, and an AM
attempt replaces at most `MAX_REPLACEMENTS` stragglers. The replacement itself is the lost-worker
replacement of appmaster.ps.recovery (`ExecutorRecovery.replace_straggler`).

A job asks for it with `replace_stragglers` in its spec (off by default: on an oversubscribed host
-- a 2-core test machine running a whole cluster -- healthy workers' times were seen to spread 2.4x
to 3.1x between epochs, and every replacement costs a container start).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence

STRAGGLER_FACTOR = 2.0      # §5.2: "half speed from the median"
MIN_BATCHES = 20            # mini-batches a worker's moving average must cover to be compared
CONFIRMATIONS = 2           # consecutive checks that must find the same worker slow
MAX_REPLACEMENTS = 3        # per AM attempt: a cluster where every new worker is slow is not helped


@dataclass(frozen=True)
class WorkerPace:
    """One worker's measured time per mini-batch (seconds) and how many mini-batches it covers."""

    worker: str
    seconds: float
    batches: int


@dataclass(frozen=True)
class Straggler:
    """A slow worker: its time per mini-batch against the median of its peers'."""

    worker: str
    seconds: float
    peers_median: float

    @property
    def slowdown(self) -> float:
        return self.seconds / self.peers_median

    def describe(self) -> str:
        return (f"worker {self.worker} takes {self.seconds * 1e3:.1f} ms per mini-batch, "
                f"{self.slowdown:.1f}x the median of its peers ({self.peers_median * 1e3:.1f} ms)")


def find_straggler(paces: Sequence[WorkerPace], factor: float = STRAGGLER_FACTOR,
                   min_batches: int = MIN_BATCHES) -> Optional[Straggler]:
    """The slowest worker whose time exceeds `factor` x its peers' median, if any (pure)."""
    measured = [p for p in paces if p.batches >= min_batches and p.seconds > 0]
    if len(measured) < 2:
        return None
    worst: Optional[Straggler] = None
    for p in measured:
        median = statistics.median(q.seconds for q in measured if q.worker != p.worker)
        if p.seconds > factor * median and (worst is None or p.seconds / median > worst.slowdown):
            worst = Straggler(p.worker, p.seconds, median)
    return worst


@dataclass
class StragglerWatch:
    """Which worker to replace now, if any: `check` at every epoch end (see the module doc)."""

    factor: float = STRAGGLER_FACTOR
    min_batches: int = MIN_BATCHES
    confirmations: int = CONFIRMATIONS
    max_replacements: int = MAX_REPLACEMENTS
    replaced: list[dict[str, object]] = field(default_factory=list)
    _suspect: Optional[str] = None
    _seen: int = 0

    def check(self, paces: Sequence[WorkerPace]) -> Optional[Straggler]:
        if len(self.replaced) >= self.max_replacements:
            return None
        found = find_straggler(paces, self.factor, self.min_batches)
        if found is None:
            self._suspect, self._seen = None, 0
            return None
        if found.worker == self._suspect:
            self._seen += 1
        else:
            self._suspect, self._seen = found.worker, 1
        if self._seen < self.confirmations:
            return None
        self._suspect, self._seen = None, 0
        return found

    def record(self, straggler: Straggler, replacement: str) -> None:
        """`straggler` was replaced by `replacement`."""
        self.replaced.append({"worker": straggler.worker, "replacement": replacement,
                              "seconds": straggler.seconds, "peers_median": straggler.peers_median})

    def status_json(self) -> dict[str, object]:
        return {"factor": self.factor, "replaced": list(self.replaced)}


__all__ = ["CONFIRMATIONS", "MAX_REPLACEMENTS", "MIN_BATCHES", "STRAGGLER_FACTOR", "Straggler", "StragglerWatch",
           "WorkerPace", "find_straggler"]
