"""Harmony's dynamic regrouping rules (dissertation §4.3.2, "Dynamic Job Regrouping"), as pure
functions of the jobs' modelled (T_cpu, T_net) at a group's machines:

* A finished job is replaced by a *similar* waiting (profiled / paused) job: iteration time and
  COMP share within `tolerance` (5 %) of the finished job's; failing that, by a bundle of two (or
  three) jobs whose summed iteration time and summed COMP share are that close.
* Failing a replacement, the finished job's group and more and more other groups (the smallest
  first) are regrouped with Algorithm 1; among those options the one with the fewest jobs is kept
  unless one with more jobs is at least `gain` (5 %) better (`fewest_within`).
* No regrouping at all for an expected gain in U under 5 % (`worth_regrouping`).

"Comp/comm ratio" is compared as the COMP share T_cpu / (T_cpu + T_net) (the same order, and
defined for a job without communication).
"""
from __future__ import annotations

import itertools
from typing import Optional, Sequence, TypeVar

TOLERANCE = 0.05
GAIN = 0.05
PAIR_LIMIT = 64         # bundles of two are searched among at most this many candidates ...
TRIPLE_LIMIT = 16       # ... and of three among at most this many

Times = tuple[float, float]     # (T_cpu, T_net) at the group's machines
K = TypeVar("K")


def _close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(abs(b), 1e-12)


def cpu_share(t: Times) -> float:
    total = t[0] + t[1]
    return t[0] / total if total > 0 else 0.0


def similar(candidate: Times, finished: Times, tolerance: float = TOLERANCE) -> bool:
    """Iteration time and COMP share within `tolerance` of the finished job's."""
    return (_close(candidate[0] + candidate[1], finished[0] + finished[1], tolerance)
            and _close(cpu_share(candidate), cpu_share(finished), tolerance))


def _distance(candidate: Times, finished: Times) -> float:
    itr = finished[0] + finished[1]
    return (abs(candidate[0] + candidate[1] - itr) / max(itr, 1e-12)
            + abs(cpu_share(candidate) - cpu_share(finished)))


def replacement(finished: Times, candidates: Sequence[tuple[K, Times]],
                tolerance: float = TOLERANCE) -> Optional[list[K]]:
    """The waiting job (or bundle of jobs) to take a finished job's place, or None.

    A single similar job first (the closest; ties to the earlier candidate), else the closest
    similar bundle of two, else of three (the bundle's times summed). Candidates are in priority
    order."""
    singles = [(k, t) for k, t in candidates if similar(t, finished, tolerance)]
    if singles:
        return [min(singles, key=lambda kt: _distance(kt[1], finished))[0]]
    for size, limit in ((2, PAIR_LIMIT), (3, TRIPLE_LIMIT)):
        pool = list(candidates)[:limit]
        best: Optional[tuple[float, list[K]]] = None
        for combo in itertools.combinations(pool, size):
            t = (sum(c[1][0] for c in combo), sum(c[1][1] for c in combo))
            if similar(t, finished, tolerance):
                d = _distance(t, finished)
                if best is None or d < best[0]:
                    best = (d, [c[0] for c in combo])
        if best is not None:
            return best[1]
    return None


def worth_regrouping(current: float, proposed: float, gain: float = GAIN) -> bool:
    """Regroup only for an expected gain in U of at least `gain` (relative)."""
    return proposed >= current * (1.0 + gain) and proposed > current


def fewest_within(options: Sequence[tuple[int, float]], gain: float = GAIN) -> int:
    """Of (jobs involved, score) options, the index of the one with the fewest jobs whose score is
    within `gain` of the best (a bigger regrouping must be 5 % better to be chosen)."""
    if not options:
        raise ValueError("no options")
    top = max(s for _, s in options)
    ok = [i for i, (_, s) in enumerate(options) if s * (1.0 + gain) >= top]
    return min(ok, key=lambda i: (options[i][0], -options[i][1], i))


__all__ = ["GAIN", "TOLERANCE", "Times", "cpu_share", "fewest_within", "replacement", "similar", "worth_regrouping"]
