"""Each queue's ideal share of the cluster, as YARN's ProportionalCapacityPreemptionPolicy computes
it, and how much to take back from each queue this round (pure: plain data in, plain data out).

YARN's fixpoint (`computeFixpointAllocation`): every queue starts at min(used, guaranteed) -- what it
keeps whatever the others want -- and the rest of the cluster is offered, round after round, to the
queues that want more (used + pending above what they were given), the most underserved first
(given / guaranteed lowest), each in proportion to its guarantee, a queue taking no more than its
maximum capacity and its demand. The limit of that process is a water level L: each queue gets
clamp(L x guaranteed, start, want), L chosen so the shares fill the cluster (or every queue gets
what it wants). `ideal_shares` computes that level exactly (sorting the breakpoints) instead of
iterating YARN's rounded offers.

Departures from YARN, and why:
  * Resources are handled per dimension (memory and vcores each filled on their own) where YARN's
    DominantResourceCalculator compares whole vectors by their dominant share: per dimension keeps
    every share within the cluster and within the queue's maximum in every resource, which the
    DRC comparison does not promise for vectors of different shapes.
  * A queue that opts out (`disable_preemption`, YARN's queue setting of that name) keeps all it
    holds: its starting share is its use, as YARN's `untouchableExtra`.
  * YARN's cluster-wide `total_preemption_per_round` cap is not modelled: the dead zone and the
    natural-termination factor already pace a round, and an elastic shrink loses no work.

Then per queue (`to_reclaim`): nothing while its use is within the dead zone -- at most
(1 + max_ignored_over_capacity) x its guarantee -- else natural_termination_factor x (use - ideal),
YARN's dampening: the queue's jobs finishing on their own give back part of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from protocol.records import ZERO, Resource

# Slack when turning exact (float) shares into whole MB / vcores: a share computed as k - 1e-12
# for an integer k is k.
_EPS = 1e-6


@dataclass(frozen=True)
class QueueDemand:
    """One leaf queue as the share computation sees it.

    `capacity` / `max_capacity` are fractions of the cluster (0 < capacity <= max_capacity <= 1);
    `used` what its apps hold, `pending` what they asked for and have not been given."""

    name: str
    capacity: float
    max_capacity: float
    used: Resource = ZERO
    pending: Resource = ZERO
    preemptable: bool = True        # False: `disable_preemption`, the queue keeps what it holds

    def __post_init__(self) -> None:
        if not (0 < self.capacity <= self.max_capacity <= 1):
            raise ValueError(f"queue {self.name!r}: need 0 < capacity <= max_capacity <= 1 (fractions), "
                             f"got capacity={self.capacity} max_capacity={self.max_capacity}")
        if not (self.used.is_nonnegative() and self.pending.is_nonnegative()):
            raise ValueError(f"queue {self.name!r}: negative used or pending resources")


@dataclass(frozen=True)
class QueueShare:
    """A queue's guaranteed, maximum and ideal share (resources), what it holds and wants, and what
    to reclaim from it this round (`reclaim`, zero for a queue within its dead zone or opted out)."""

    name: str
    guaranteed: Resource
    maximum: Resource
    used: Resource
    pending: Resource
    ideal: Resource
    reclaim: Resource

    @property
    def over(self) -> Resource:
        """How far its use is above its ideal share (per dimension, never negative)."""
        return Resource(max(0, self.used.memory - self.ideal.memory), max(0, self.used.vcores - self.ideal.vcores))

    @property
    def owed(self) -> Resource:
        """How far its ideal share is above its use: capacity the other queues' jobs must not grow into."""
        return Resource(max(0, self.ideal.memory - self.used.memory), max(0, self.ideal.vcores - self.used.vcores))


def water_fill(total: float, weights: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> list[float]:
    """The shares clamp(L x w_i, lo_i, hi_i) whose sum is `total` (or every hi_i when they sum to
    less; every lo_i when those sum to more): YARN's proportional offers taken to their limit.
    Weights must be positive and lo_i <= hi_i."""
    n = len(weights)
    if not (len(lows) == len(highs) == n):
        raise ValueError("weights, lows and highs must have the same length")
    if any(w <= 0 for w in weights) or any(lo > hi for lo, hi in zip(lows, highs)):
        raise ValueError("need positive weights and lo <= hi")
    if sum(highs) <= total:
        return list(highs)
    if sum(lows) >= total:
        # Guarantees that add up to more than the cluster (or a cluster that lost nodes under its
        # use): everyone keeps the same fraction of what it would keep, so the shares still fit.
        scale = total / sum(lows) if sum(lows) > 0 else 0.0
        return [lo * scale for lo in lows]

    def filled(level: float) -> float:
        return sum(min(max(level * w, lo), hi) for w, lo, hi in zip(weights, lows, highs))
    # filled() is piecewise linear in the level, bent only where some queue starts or stops
    # growing: find the bend points around `total`, then solve the linear piece between them.
    points = sorted({lo / w for w, lo in zip(weights, lows)} | {hi / w for w, hi in zip(weights, highs)})
    below = 0.0
    for p in points:
        if filled(p) >= total:
            break
        below = p
    else:       # unreachable: filled(max point) = sum(highs) > total
        return list(highs)
    f0, f1 = filled(below), filled(p)
    level = below if f1 == f0 else below + (p - below) * (total - f0) / (f1 - f0)
    return [min(max(level * w, lo), hi) for w, lo, hi in zip(weights, lows, highs)]


def _fill_dimension(total: int, queues: Sequence[QueueDemand], used: Sequence[int], pending: Sequence[int]) -> list[int]:
    guaranteed = [q.capacity * total for q in queues]
    maximum = [q.max_capacity * total for q in queues]
    lows = [float(u) if not q.preemptable else min(float(u), g) for q, u, g in zip(queues, used, guaranteed)]
    highs = [max(lo, min(m, float(u + p))) for lo, m, u, p in zip(lows, maximum, used, pending)]
    shares = water_fill(float(total), [q.capacity for q in queues], lows, highs)
    return [int(math.floor(s + _EPS)) for s in shares]


def ideal_shares(total: Resource, queues: Sequence[QueueDemand], *, max_ignored_over_capacity: float = 0.1,
                 natural_termination_factor: float = 0.2) -> dict[str, QueueShare]:
    """Each queue's ideal share of `total` and what to reclaim from it this round (see the module
    docstring). Shares never sum above the cluster, never exceed a queue's maximum, and never fall
    below min(guarantee, use + pending) -- nor below its use for a queue that opted out."""
    if not 0 <= max_ignored_over_capacity <= 1:
        raise ValueError(f"max_ignored_over_capacity must be within [0, 1], got {max_ignored_over_capacity}")
    if not 0 < natural_termination_factor <= 1:
        raise ValueError(f"natural_termination_factor must be within (0, 1], got {natural_termination_factor}")
    names = [q.name for q in queues]
    if len(set(names)) != len(names):
        raise ValueError(f"queue names repeat: {names}")
    if not queues:
        return {}
    mem = _fill_dimension(total.memory, queues, [q.used.memory for q in queues], [q.pending.memory for q in queues])
    vc = _fill_dimension(total.vcores, queues, [q.used.vcores for q in queues], [q.pending.vcores for q in queues])
    out: dict[str, QueueShare] = {}
    for q, m, v in zip(queues, mem, vc):
        ideal = Resource(m, v)
        guaranteed = Resource(int(q.capacity * total.memory), int(q.capacity * total.vcores))
        maximum = Resource(int(q.max_capacity * total.memory + _EPS), int(q.max_capacity * total.vcores + _EPS))
        reclaim = ZERO
        dead_zone = (guaranteed.memory * (1 + max_ignored_over_capacity),
                     guaranteed.vcores * (1 + max_ignored_over_capacity))
        if q.preemptable and (q.used.memory > dead_zone[0] or q.used.vcores > dead_zone[1]):
            over = (max(0, q.used.memory - m), max(0, q.used.vcores - v))
            reclaim = Resource(math.ceil(over[0] * natural_termination_factor - _EPS),
                               math.ceil(over[1] * natural_termination_factor - _EPS))
        out[q.name] = QueueShare(q.name, guaranteed, maximum, q.used, q.pending, ideal, reclaim)
    return out


def owed_to_others(shares: Mapping[str, QueueShare], queue: str) -> Resource:
    """What the queues other than `queue` are owed (ideal above use): the free room `queue`'s jobs
    may not grow into."""
    return sum((s.owed for name, s in shares.items() if name != queue), ZERO)


def total_of(shares: Iterable[QueueShare]) -> Resource:
    """The sum of the shares' ideal resources."""
    return sum((s.ideal for s in shares), ZERO)


__all__ = ["QueueDemand", "QueueShare", "ideal_shares", "owed_to_others", "total_of", "water_fill"]
