"""The ground truth Harmony's grouping is measured against (dissertation §4.4.7): every subset of
the jobs, every partition of it into groups and every split of the machines among the groups,
keeping the one with the best modelled utilization score. With per-job machine `Bounds`, only
groups of m within their jobs' bounds, and machines may stay idle (counting as zero in U) where the
bounds leave no group to take them. Exponential: small instances only."""
from __future__ import annotations

import itertools
from typing import Iterator, Optional

import numpy as np

from models.harmony import CPU_WEIGHT, FloatArray

from rm.policies.harmony_grouping import EMPTY, Bounds, Grouping, evaluate


def partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every set partition of `items` (Bell(n) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write `total` as `parts` positive integers, in order."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def best_grouping(t_cpu1: FloatArray, t_net: FloatArray, machines: int, cap: Optional[int] = None,
                  cpu_weight: float = CPU_WEIGHT, fifo: bool = True, bounds: Optional[Bounds] = None,
                  t_link: Optional[FloatArray] = None) -> Grouping:
    """The grouping on all `machines` with the highest score of the first k jobs for any k (`fifo`:
    jobs start in priority order, as Algorithm 1 admits them), or of any subset of them; with
    `bounds`, each group's m within its jobs' bounds, on all the machines or fewer; `t_link`: the
    jobs' link times (COMM at each group's m, models/harmony.py `net_time`; None: zeros)."""
    t_cpu1 = np.asarray(t_cpu1, dtype=np.float64)
    t_net = np.asarray(t_net, dtype=np.float64)
    # A job whose bounds no m <= machines meets never runs; the rest are admitted in order.
    jobs = [j for j in range(len(t_cpu1))
            if bounds is None or bounds.lo[j] <= min(int(bounds.hi[j]), machines)]
    n = len(jobs)
    best = EMPTY
    for size in range(1, n + 1):
        subsets = [tuple(jobs[:size])] if fifo else itertools.combinations(jobs, size)
        for subset in subsets:
            for part in partitions(list(subset)):
                if len(part) > machines or (cap is not None and any(len(g) > cap for g in part)):
                    continue
                # Unbounded, every machine goes to a group (as the allocation gives them all; with
                # t_link = 0 a group never loses by one machine more).
                totals = [machines] if bounds is None else range(len(part), machines + 1)
                for m in (m for t in totals for m in compositions(t, len(part))):
                    if bounds is not None and not all(bounds.admits(g, mg) for g, mg in zip(part, m)):
                        continue
                    g = evaluate(t_cpu1, t_net, part, m, cpu_weight, machines, t_link)
                    if g.score > best.score + 1e-12:
                        best = g
    return best


__all__ = ["best_grouping", "compositions", "partitions"]
