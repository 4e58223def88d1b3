"""Harmony's grouping: Algorithm 1 (how many jobs, how many groups), Algorithm 2 (which job in which
group, job-bound check, swap fine-tuning) and machine allocation (dissertation §4.3.2).

Pure functions of the jobs' profiles (models/harmony.py: `t_cpu1` = COMP time on one machine,
`t_net` = COMM time on one machine (t_net_local), `t_link` = the link time of a worker's whole
exchange, per iteration; T_net(m) = t_net + t_link (m-1)/m, `net_time`) and a machine count; they
return a `Grouping` of job indices. `t_link` defaults to zeros, the paper's COMM constant in m.
Which nodes a group gets, and what the jobs are told, is the policy's business (harmony.py).

Departures from the paper, and why:
* Algorithm 1 grows the number of jobs considered one at a time (L4) and evaluates a full grouping
  each time; at 8,000 jobs that is 8,000 groupings. Up to `linear_limit` jobs it does exactly
  that; beyond, the count grows geometrically (x`growth`): O(log n) groupings instead of O(n).
* It stops (L10-13) not at the first count that does not raise U but after `PATIENCE` counts in a
  row that do not, once the count is `PATIENCE_GROWTH` times the best one: on a large cluster U
  rises with the job count but not monotonically (one more job can change n_G and the split), and
  the first dip stopped it at a small fraction of the jobs it could run well (the grouping tests
  have such a case).
* L6's argmin over n_G of sum_j |T_cpu_j(n_G) - T_net_j| is a sum of convex pieces in n_G: its
  minimum is the weighted median of the jobs' balance points (weights t_cpu1), found by one sort;
  the two integers around it are compared. n_G is kept within [ceil(n_j / cap), min(n_j, M)].
* Algorithm 2 L6 reads `while |g| <= floor(|J| / n_G)`, which would take one job more per group
  than the text ("until each of the n_G groups are filled up with floor(|J|/n_G) jobs") and the
  remainder step allow; it fills to floor(|J| / n_G).
* `cap` bounds the jobs of a group: each job runs a worker and a server on every node of its
  group, so a node holds 2 containers per job (the policy derives the cap from the nodes).
* Fine-tuning swaps run "until there are no possible swap cases"; each swap strictly lowers the
  two groups' summed imbalance, so it terminates, but at thousands of groups it may take long:
  `swap_budget` bounds the swaps per grouping. A swap that would make a group job-bound that was
  not is not taken.
* Machine allocation gives one machine to every group, then one at a time to the group whose COMP
  most exceeds its COMM at its current m (the "most computation-intensive"), until every machine
  is given. That greedy picks the largest of the decreasing marginal values C_g/m - N_g, so it is
  computed in one go: a threshold found by bisection, ties broken by group order.
* Machine bounds (an addition; the paper gives every job whatever m its group gets): a job may run
  only in a group of m machines within its `Bounds` (the policy derives them from its spec's
  min/max workers and servers, one of each per node). Algorithm 2 ignores them; a repair pass then
  moves a job out of a group whose members' bounds do not meet into the most balanced compatible
  group (or a group of its own), and while the groups' minimums exceed the machines merges two
  compatible groups (they share machines) or, with none, drops the latest-admitted job; the
  allocation starts every group at its minimum and gives none past its maximum (machines no group
  may take stay idle and count as zero in U), and the refinement takes no move that breaks a bound.
  Besides L6's n_G, the counts ceil(M / max) at which each maximum holds the equal split are tried.
  Bounds that bind nobody (every minimum 1, every maximum >= M) take the unbounded path.
* COMM grows with m (models/harmony.py, `net_time`), so each step reads T_net at the machines it
  assumes: L6 and Algorithm 2 at the equal DoP M / n_G, the allocation and the refinement at each
  group's m_g. C/m - T_net(m) = (C + L)/m - (N + L) for a group's summed COMP on one machine C,
  COMM N and link time L: L6's balance points and the allocation's marginal values are the
  paper's with C + L and N + L in place of C and N, so both keep their closed forms.
* Additions, for quality on small instances: besides L6's n_G, n_G - 1 and n_G + 1 are tried (every
  possible n_G when there are fewer than `SMALL_GROUP_COUNTS`), and groupings of up to
  `REFINE_LIMIT` jobs on up to `REFINE_MACHINES` machines are hill-climbed on the model's score
  (`refine`). Algorithm 2 balances at an assumed equal DoP and allocates machines afterwards; on
  2-6 job instances that alone is up to 17 % below exhaustive search, with these within 1 %.
"""
from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from models.harmony import CPU_WEIGHT, FloatArray, IntArray, group_stats, net_time, score

LINEAR_LIMIT = 32
GROWTH = 1.25
SWAP_BUDGET = 256
REFINE_BUDGET = 64
REFINE_LIMIT = 16       # refine only groupings of up to this many jobs (a pass is O(n^2) moves) ...
REFINE_MACHINES = 128   # ... on up to this many machines
PATIENCE = 2            # Algorithm 1 stops after this many job counts without a better U ...
PATIENCE_GROWTH = 1.5   # ... and once the count has grown this much past the best one
NEIGHBOUR_LIMIT = 256   # up to this many jobs, n_G +- 1 are tried too
SMALL_GROUP_COUNTS = 8      # below this many possible group counts, Algorithm 1 tries each


@dataclass(frozen=True)
class Grouping:
    """Jobs (indices into the profiles given) in groups, and each group's machines."""

    groups: tuple[tuple[int, ...], ...]
    machines: tuple[int, ...]
    utilization: tuple[float, float]    # eq. 4.4 [U_cpu, U_net]
    score: float

    @property
    def jobs(self) -> list[int]:
        return sorted(j for g in self.groups for j in g)

    def group_of(self, n_jobs: int) -> IntArray:
        """Per job its group index (-1: not running)."""
        out = np.full(n_jobs, -1, dtype=np.int64)
        for i, g in enumerate(self.groups):
            out[list(g)] = i
        return out


EMPTY = Grouping((), (), (0.0, 0.0), 0.0)


@dataclass(frozen=True)
class Bounds:
    """Per job the machines its group may have: lo[j] <= m_g <= hi[j] (a job runs one worker and one
    server per machine, so these are its spec's min / max workers and servers)."""

    lo: IntArray
    hi: IntArray

    @staticmethod
    def of(lo: Sequence[int], hi: Sequence[int]) -> "Bounds":
        return Bounds(np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64))

    def take(self, n: int) -> "Bounds":
        """The first n jobs' bounds."""
        return Bounds(self.lo[:n], self.hi[:n])

    def group(self, jobs: Sequence[int]) -> tuple[int, int]:
        """(lowest, highest) m a group of `jobs` may have (lowest > highest: no m fits them all)."""
        if not len(jobs):
            return 1, np.iinfo(np.int64).max
        idx = list(jobs)
        return max(1, int(self.lo[idx].max())), int(self.hi[idx].min())

    def meet(self, jobs: Sequence[int]) -> bool:
        """Some m suits every job of `jobs` (their bounds overlap)."""
        lo, hi = self.group(jobs)
        return lo <= hi

    def admits(self, jobs: Sequence[int], m: int) -> bool:
        lo, hi = self.group(jobs)
        return lo <= m <= hi


def _links(t_link: Optional[FloatArray], n: int) -> FloatArray:
    """Per job its t_link (zeros when not given: the paper's model)."""
    if t_link is None:
        return np.zeros(n)
    out: FloatArray = np.asarray(t_link, dtype=np.float64)
    if out.shape != (n,):
        raise ValueError(f"t_link has {out.size} entries for {n} jobs")
    return out


def evaluate(t_cpu1: FloatArray, t_net: FloatArray, groups: Sequence[Sequence[int]], machines: Sequence[int],
             cpu_weight: float = CPU_WEIGHT, total: Optional[int] = None,
             t_link: Optional[FloatArray] = None) -> Grouping:
    """A `Grouping` of `groups` on `machines`, with its modelled utilization and score (over `total`
    machines where given, those no group has counting as idle; COMM at each group's m_g)."""
    group_of = np.full(len(t_cpu1), -1, dtype=np.int64)
    for i, g in enumerate(groups):
        group_of[list(g)] = i
    u = group_stats(t_cpu1, t_net, group_of, np.asarray(machines, dtype=np.int64),
                    t_link=_links(t_link, len(t_cpu1))).cluster()
    used = int(sum(machines))
    if total is not None and total > used > 0:
        u = u * used / total
    return Grouping(tuple(tuple(g) for g in groups), tuple(int(m) for m in machines),
                    (float(u[0]), float(u[1])), score(u, cpu_weight))


# ----- Algorithm 1, L6: the number of groups ----------------------------------------------------------------------
def balance_groups(t_cpu1: FloatArray, t_net: FloatArray, machines: int, cap: Optional[int] = None,
                   t_link: Optional[FloatArray] = None) -> int:
    """argmin over n_G of sum_j |t_cpu1_j * n_G / M - T_net_j(M / n_G)| (equal machines per
    group), within [ceil(n / cap), min(n, M)]."""
    n = len(t_cpu1)
    lo = max(1, -(-n // cap)) if cap else 1
    hi = max(lo, min(n, machines))
    link = _links(t_link, n)
    # T_cpu - T_net at DoP M/n_G is (t_cpu1 + L) n_G / M - (t_net + L): the paper's form (module doc).
    a = (np.asarray(t_cpu1, dtype=np.float64) + link) / machines
    b = np.asarray(t_net, dtype=np.float64) + link

    def cost(ng: int) -> float:
        return float(np.abs(a * ng - b).sum())

    pos = a > 0
    if not np.any(pos):
        return lo
    # Weighted median of the balance points b/a (weights a): where the slope turns non-negative.
    points = b[pos] / a[pos]
    order = np.argsort(points, kind="stable")
    cum = np.cumsum(a[pos][order])
    median = float(points[order][int(np.searchsorted(cum, cum[-1] / 2.0))])
    candidates = {min(hi, max(lo, c)) for c in (math.floor(median), math.ceil(median))}
    return min(sorted(candidates), key=cost)


# ----- Algorithm 2: jobs into groups --------------------------------------------------------------------------------
class _Groups:
    """Groups being filled: members, and per group the sums Algorithm 2 reads."""

    def __init__(self, n_groups: int):
        self.members: list[list[int]] = [[] for _ in range(n_groups)]
        self.cpu = [0.0] * n_groups
        self.net = [0.0] * n_groups
        self.max_itr = [0.0] * n_groups

    def diff(self, g: int) -> float:
        return self.cpu[g] - self.net[g]

    def add(self, g: int, j: int, cpu: float, net: float) -> None:
        self.members[g].append(j)
        self.cpu[g] += cpu
        self.net[g] += net
        self.max_itr[g] = max(self.max_itr[g], cpu + net)

    def job_bound_with(self, g: int, cpu: float, net: float) -> bool:
        """Would group g plus a job (cpu, net) be job-bound (eq. 4.1's third term the largest)?"""
        itr = max(self.max_itr[g], cpu + net)
        return itr > max(self.cpu[g] + cpu, self.net[g] + net)

    def job_bound(self, g: int) -> bool:
        return bool(self.members[g]) and self.max_itr[g] > max(self.cpu[g], self.net[g])


def _first_untaken(queue: list[int], start: int, taken: bytearray) -> int:
    while start < len(queue) and taken[queue[start]]:
        start += 1
    return start


def assign_jobs(t_cpu: FloatArray, t_net: FloatArray, n_groups: int, cap: Optional[int] = None,
                swap_budget: int = SWAP_BUDGET) -> list[list[int]]:
    """Algorithm 2: the jobs (COMP times `t_cpu` at the groups' common DoP) in `n_groups` groups."""
    n = len(t_cpu)
    cpu = [float(x) for x in t_cpu]
    net = [float(x) for x in t_net]
    diff = [c - m for c, m in zip(cpu, net)]
    itr = [c + m for c, m in zip(cpu, net)]
    order = sorted(range(n), key=lambda j: (-itr[j], j))                      # L2
    pos = [j for j in order if diff[j] >= 0]
    neg = [j for j in order if diff[j] <= 0]
    taken = bytearray(n)
    i_all = i_pos = i_neg = 0
    per_group = n // n_groups if cap is None else min(cap, n // n_groups)
    gs = _Groups(n_groups)
    for g in range(n_groups):                                                 # L4-11
        s = 0.0
        for _ in range(per_group):
            j = -1
            if s > 0:       # CPU-bound so far: the largest job that is not (L7)
                i_neg = _first_untaken(neg, i_neg, taken)
                j = neg[i_neg] if i_neg < len(neg) else -1
            elif s < 0:
                i_pos = _first_untaken(pos, i_pos, taken)
                j = pos[i_pos] if i_pos < len(pos) else -1
            if j < 0:       # no complementary job (or an empty group): the largest (L8-9)
                i_all = _first_untaken(order, i_all, taken)
                j = order[i_all]
            taken[j] = 1
            gs.add(g, j, cpu[j], net[j])
            s += diff[j]
    rest = sorted((j for j in order if not taken[j]), key=lambda j: (-abs(diff[j]), j))    # L12
    # Groups that can still take a job, by S_g (a full group leaves, so the search skips none).
    keys = sorted((gs.diff(g), g) for g in range(n_groups) if cap is None or len(gs.members[g]) < cap)
    for j in rest:                                                            # L13-22
        chosen = -1
        fallback = -1
        for g in _nearest(keys, -diff[j]):
            if fallback < 0:
                fallback = g
            if itr[j] > gs.max_itr[g] and gs.job_bound_with(g, cpu[j], net[j]):
                continue
            chosen = g
            break
        if chosen < 0:
            chosen = fallback
        if chosen < 0:
            break           # every group full: the caller asked for more jobs than fit
        keys.remove((gs.diff(chosen), chosen))
        gs.add(chosen, j, cpu[j], net[j])
        if cap is None or len(gs.members[chosen]) < cap:
            bisect.insort(keys, (gs.diff(chosen), chosen))
    _fine_tune(gs, sorted((gs.diff(g), g) for g in range(n_groups)), diff, cpu, net, swap_budget)
    return gs.members


def _nearest(keys: list[tuple[float, int]], target: float) -> Iterator[int]:
    """Groups in increasing |S_g - target| (i.e. |T_diff_j + S_g| for target = -T_diff_j)."""
    hi = bisect.bisect_left(keys, (target, -1))
    lo = hi - 1
    while lo >= 0 or hi < len(keys):
        if hi >= len(keys) or (lo >= 0 and target - keys[lo][0] <= keys[hi][0] - target):
            yield keys[lo][1]
            lo -= 1
        else:
            yield keys[hi][1]
            hi += 1


def _fine_tune(gs: _Groups, keys: list[tuple[float, int]], diff: list[float], cpu: list[float], net: list[float],
               budget: int) -> None:
    """Swap a job of the most imbalanced group with one of the most complementary group while that
    lowers both groups' summed imbalance |S_gu| + |S_g| (Algorithm 2's fine-tuning)."""
    if len(keys) < 2:
        return
    for _ in range(budget):
        lo_s, lo_g = keys[0]
        hi_s, hi_g = keys[-1]
        # The most imbalanced group is at one end; the farthest from it is the other end.
        gu, gp = (hi_g, lo_g) if abs(hi_s) >= abs(lo_s) else (lo_g, hi_g)
        su, sp = gs.diff(gu), gs.diff(gp)
        a = np.array([diff[j] for j in gs.members[gu]])
        b = np.array([diff[j] for j in gs.members[gp]])
        if a.size == 0 or b.size == 0:
            return
        delta = b[None, :] - a[:, None]             # S_gu gains d_b - d_a, S_gp loses it
        after = np.abs(su + delta) + np.abs(sp - delta)
        before = abs(su) + abs(sp)
        flat = np.argsort(after, axis=None, kind="stable")
        swapped = False
        for k in flat[:8]:          # the best few pairs; a job-bound veto rarely rejects more
            if after.flat[k] >= before - 1e-12 * max(1.0, before):
                break
            ia, ib = divmod(int(k), b.size)
            ja, jb = gs.members[gu][ia], gs.members[gp][ib]
            if _swap_makes_job_bound(gs, gu, ja, jb, cpu, net) or _swap_makes_job_bound(gs, gp, jb, ja, cpu, net):
                continue
            keys.remove((su, gu))
            keys.remove((sp, gp))
            _replace(gs, gu, ja, jb, cpu, net)
            _replace(gs, gp, jb, ja, cpu, net)
            bisect.insort(keys, (gs.diff(gu), gu))
            bisect.insort(keys, (gs.diff(gp), gp))
            swapped = True
            break
        if not swapped:
            return


def _members_after(gs: _Groups, g: int, out_j: int, in_j: int) -> list[int]:
    return [in_j if j == out_j else j for j in gs.members[g]]


def _swap_makes_job_bound(gs: _Groups, g: int, out_j: int, in_j: int, cpu: list[float], net: list[float]) -> bool:
    if gs.job_bound(g):
        return False
    members = _members_after(gs, g, out_j, in_j)
    c = sum(cpu[j] for j in members)
    m = sum(net[j] for j in members)
    return max(cpu[j] + net[j] for j in members) > max(c, m)


def _replace(gs: _Groups, g: int, out_j: int, in_j: int, cpu: list[float], net: list[float]) -> None:
    gs.members[g] = _members_after(gs, g, out_j, in_j)
    gs.cpu[g] += cpu[in_j] - cpu[out_j]
    gs.net[g] += net[in_j] - net[out_j]
    gs.max_itr[g] = max(cpu[j] + net[j] for j in gs.members[g])


# ----- machine allocation -------------------------------------------------------------------------------------------
def allocate_machines(cpu1: FloatArray, net: FloatArray, machines: int, least: Optional[Sequence[int]] = None,
                      most: Optional[Sequence[int]] = None, link: Optional[FloatArray] = None) -> IntArray:
    """Per group m_g >= 1 summing to `machines`: one each, then each next machine to the group with
    the largest C_g/m_g - N_g(m_g) (C_g = its jobs' COMP on one machine, N_g = their COMM, N_g(m) =
    N_g + L_g (m-1)/m with L_g their summed link times `link`). With per
    group bounds `least` / `most`: each starts at its least and takes none past its most (the sum
    may then fall short of `machines`)."""
    lk = _links(link, np.asarray(cpu1).size)
    c = np.asarray(cpu1, dtype=np.float64) + lk     # C/m - N(m) = (C + L)/m - (N + L)
    n = np.asarray(net, dtype=np.float64) + lk
    k = c.size
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if least is not None or most is not None:
        return _allocate_bounded(c, n, machines, least, most)
    if machines < k:
        raise ValueError(f"{k} groups need at least {k} machines, got {machines}")
    rest = machines - k

    def extra(t: float) -> IntArray:
        # How many of the values C/m - N (m = 1, 2, ...) exceed t, per group (capped at rest + 1).
        s = t + n
        with np.errstate(divide="ignore", invalid="ignore"):
            cnt = np.where(s > 0, np.ceil(c / np.where(s > 0, s, 1.0)) - 1.0, float(rest + 1))
        out: IntArray = np.minimum(np.maximum(cnt, 0.0), float(rest + 1)).astype(np.int64)
        return out

    m = np.ones(k, dtype=np.int64)
    if rest == 0:
        return m
    lo = float(-n.min()) - 1.0          # below every group's limit: more than `rest` values exceed it
    hi = float((c - n).max())           # no value exceeds the largest first one
    if int(extra(hi).sum()) > rest:     # cannot happen; guard the bisection's invariant
        hi = float(np.abs(c).max() + np.abs(n).max() + 1.0)
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if mid <= lo or mid >= hi:
            break
        given = int(extra(mid).sum())
        if given > rest:
            lo = mid
        else:
            hi = mid
            if given == rest:
                break
    m += extra(hi)
    left = machines - int(m.sum())
    while left > 0:
        # The next marginal values, largest first; ties to the lower group index.
        nxt = c / m - n
        take = np.lexsort((np.arange(k), -nxt))[:left]
        m[take] += 1
        left -= take.size
    return m


def _allocate_bounded(c: FloatArray, n: FloatArray, machines: int, lo: Optional[Sequence[int]],
                      hi: Optional[Sequence[int]]) -> IntArray:
    """`allocate_machines` with bounds: the same greedy from m = lo, skipping groups at their hi."""
    k = c.size
    m = np.maximum(1, np.asarray(lo if lo is not None else np.ones(k), dtype=np.int64)).astype(np.int64)
    top = np.asarray(hi if hi is not None else np.full(k, machines), dtype=np.int64)
    if np.any(m > top) or int(m.sum()) > machines:
        raise ValueError(f"the groups' bounds need {int(m.sum())} machines (or admit none), got {machines}")
    heap = [(-(c[g] / m[g] - n[g]), g) for g in range(k) if m[g] < top[g]]
    heapq.heapify(heap)
    left = machines - int(m.sum())
    while left > 0 and heap:
        _, g = heapq.heappop(heap)
        m[g] += 1
        left -= 1
        if m[g] < top[g]:
            heapq.heappush(heap, (-(c[g] / m[g] - n[g]), g))
    return m


# ----- refinement by the model -------------------------------------------------------------------------------------
def _group_value(cpu1: list[float], net: list[float], link: list[float], m: int, w: float) -> float:
    """m_g * score(U(g)): a group's share of M * score(U) (eq. 4.3-4.4), COMM at m_g (`net_time`)."""
    if not cpu1:
        return 0.0
    f = (m - 1) / m
    nets = [n + lk * f for n, lk in zip(net, link)]
    sc = sum(cpu1) / m
    sn = sum(nets)
    t = max(sc, sn, max(c / m + n for c, n in zip(cpu1, nets)))
    return m * (w * sc + (1.0 - w) * sn) / t if t > 0 else 0.0


def refine(t_cpu1: FloatArray, t_net: FloatArray, grouping: Grouping, cap: Optional[int] = None,
           budget: int = REFINE_BUDGET, cpu_weight: float = CPU_WEIGHT, bounds: Optional[Bounds] = None,
           total: Optional[int] = None, t_link: Optional[FloatArray] = None) -> Grouping:
    """Hill-climb the grouping on the model's score itself: move machines (1, 2, 4, ...) from one
    group to another, move a job to another group (a group left empty gives its machines to that group), or
    swap two jobs of different groups, taking the best improving move, at most `budget` moves.
    Algorithm 2 balances COMP against COMM at an assumed equal DoP and allocates machines after;
    this repairs what that split misses on small instances (see bench/harmony_schedule.py). With
    `bounds` (the grouping given must meet them) no move breaks one; `total`: as in `evaluate`."""
    c = [float(x) for x in t_cpu1]
    nt = [float(x) for x in t_net]
    lk = [float(x) for x in _links(t_link, len(c))]
    groups = [list(g) for g in grouping.groups]
    m = list(grouping.machines)
    w = cpu_weight

    def val(g: list[int], mg: int) -> float:
        if bounds is not None and g and not bounds.admits(g, mg):
            return -math.inf        # never an improving move
        return _group_value([c[j] for j in g], [nt[j] for j in g], [lk[j] for j in g], mg, w)

    vals = [val(g, mg) for g, mg in zip(groups, m)]
    for _ in range(budget):
        best = 1e-12 * max(1.0, sum(vals))
        move: Optional[tuple[str, int, int, int, int]] = None
        k = len(groups)
        for a in range(k):
            if m[a] > 1 and len(groups[a]) > 1:
                for j in groups[a]:     # j leaves for a new group of its own, with one of a's machines
                    rest = [x for x in groups[a] if x != j]
                    d = val(rest, m[a] - 1) + val([j], 1) - vals[a]
                    if d > best:
                        best, move = d, ("split", a, a, j, 0)
            for b in range(k):
                if a == b:
                    continue
                step = 1
                while step < m[a]:      # 1, 2, 4, ... machines at once: fewer moves on big groups
                    d = val(groups[a], m[a] - step) + val(groups[b], m[b] + step) - vals[a] - vals[b]
                    if d > best:
                        best, move = d, ("machine", a, b, step, 0)
                    step *= 2
                if cap is None or len(groups[b]) < cap:
                    for j in groups[a]:
                        rest = [x for x in groups[a] if x != j]
                        mb = m[b] + (0 if rest else m[a])
                        d = (val(rest, m[a]) if rest else 0.0) + val(groups[b] + [j], mb) - vals[a] - vals[b]
                        if d > best:
                            best, move = d, ("job", a, b, j, 0)
                if a < b:
                    for j in groups[a]:
                        for i in groups[b]:
                            ga = [i if x == j else x for x in groups[a]]
                            gb = [j if x == i else x for x in groups[b]]
                            d = val(ga, m[a]) + val(gb, m[b]) - vals[a] - vals[b]
                            if d > best:
                                best, move = d, ("swap", a, b, j, i)
        if move is None:
            break
        kind, a, b, j, i = move
        if kind == "split":
            groups[a] = [x for x in groups[a] if x != j]
            m[a] -= 1
            groups.append([j])
            m.append(1)
            vals.append(val([j], 1))
        elif kind == "machine":
            m[a] -= j
            m[b] += j
        elif kind == "job":
            groups[a] = [x for x in groups[a] if x != j]
            groups[b] = groups[b] + [j]
            if not groups[a]:
                m[b] += m[a]
                m[a] = 0
        else:
            groups[a] = [i if x == j else x for x in groups[a]]
            groups[b] = [j if x == i else x for x in groups[b]]
        vals[a] = val(groups[a], m[a]) if groups[a] else 0.0
        vals[b] = val(groups[b], m[b])
        if not groups[a]:
            del groups[a], m[a], vals[a]
    return evaluate(t_cpu1, t_net, groups, m, cpu_weight, total, t_link)


# ----- Algorithm 1 -------------------------------------------------------------------------------------------------
def job_counts(n: int, linear_limit: int = LINEAR_LIMIT, growth: float = GROWTH) -> Iterator[int]:
    """The numbers of jobs Algorithm 1 tries: 1 (only if n == 1), 2, 3, ... linear_limit, then
    geometrically growing, ending with n."""
    if n <= 0:
        return
    if n == 1:
        yield 1
        return
    k = 2
    while k < n:
        yield k
        k = k + 1 if k < linear_limit else max(k + 1, int(k * growth))
    yield n


def repair(groups: list[list[int]], diff: Sequence[float], bounds: Bounds, machines: int,
           cap: Optional[int] = None) -> list[list[int]]:
    """`groups` made to meet `bounds` on `machines`: a job no m <= machines suits is dropped; a job
    whose bounds do not meet its group's earlier members' moves to the compatible group (room under
    `cap`) whose imbalance S_g (sum of `diff`) it offsets best, else to a group of its own; then,
    while the groups need more machines than there are, two compatible groups are merged or, with
    none, the latest-admitted job (highest index) is dropped."""
    ok = [j for g in groups for j in g if bounds.lo[j] <= min(int(bounds.hi[j]), machines)]
    fits = set(ok)
    kept: list[list[int]] = []
    orphans: list[int] = []
    for g in groups:
        mine: list[int] = []
        for j in g:
            if j not in fits:
                continue
            (mine if bounds.meet(mine + [j]) else orphans).append(j)
        if mine:
            kept.append(mine)
    for j in sorted(orphans):
        best, best_cost = -1, math.inf
        for i, g in enumerate(kept):
            if bounds.meet(g + [j]) and (cap is None or len(g) < cap):
                cost = abs(sum(diff[x] for x in g) + diff[j])
                if cost < best_cost:
                    best, best_cost = i, cost
        if best < 0:
            kept.append([j])
        else:
            kept[best].append(j)

    def need() -> int:
        return sum(bounds.group(g)[0] for g in kept)

    while kept and (len(kept) > machines or need() > machines):
        # Two groups whose bounds meet share their machines (saving the smaller minimum) before
        # any job is dropped: the pair that saves the most, within `cap`.
        pairs = [(min(bounds.group(a)[0], bounds.group(b)[0]), i, k) for i, a in enumerate(kept)
                 for k, b in enumerate(kept[i + 1:], i + 1)
                 if (cap is None or len(a) + len(b) <= cap) and bounds.meet(a + b)]
        if pairs:
            _, i, k = max(pairs, key=lambda x: (x[0], -x[1], -x[2]))
            kept[i] = kept[i] + kept.pop(k)
            continue
        last = max(j for g in kept for j in g)
        kept = [[j for j in g if j != last] for g in kept]
        kept = [g for g in kept if g]
    return kept


def group_jobs(t_cpu1: FloatArray, t_net: FloatArray, machines: int, cap: Optional[int] = None,
               swap_budget: int = SWAP_BUDGET, cpu_weight: float = CPU_WEIGHT, neighbours: bool = True,
               refine_budget: int = REFINE_BUDGET, bounds: Optional[Bounds] = None,
               t_link: Optional[FloatArray] = None) -> Grouping:
    """Algorithm 2 and machine allocation for all the jobs given: their groups on `machines` (each
    within its jobs' `bounds`, where given: see `repair`)."""
    t_cpu1 = np.asarray(t_cpu1, dtype=np.float64)
    t_net = np.asarray(t_net, dtype=np.float64)
    n = len(t_cpu1)
    if n == 0 or machines < 1:
        return EMPTY
    link = _links(t_link, n)
    best = EMPTY
    lo = max(1, -(-n // cap)) if cap else 1
    balanced = balance_groups(t_cpu1, t_net, machines, cap, link)
    hi = min(n, machines)
    tries = [balanced]
    if neighbours and n <= NEIGHBOUR_LIMIT:
        # L6 assumes equal machines per group; its neighbours (every count, on small instances)
        # are cheap starting points for the refinement.
        tries += list(range(lo, hi + 1)) if hi - lo < SMALL_GROUP_COUNTS else [balanced - 1, balanced + 1]
    if bounds is not None:
        # L6's equal split of the machines may exceed the jobs' maximums (their groups then leave
        # machines idle): the counts at which each maximum holds the equal split are tried too.
        tries += [min(hi, -(-machines // int(h))) for h in np.unique(np.minimum(bounds.hi, machines)) if h >= 1]
    for n_groups in dict.fromkeys(tries):
        if not lo <= n_groups <= hi:
            continue
        t_cpu = t_cpu1 * n_groups / machines     # at the equal DoP M / n_G
        t_net_at = net_time(t_net, link, machines / n_groups)
        groups = [g for g in assign_jobs(t_cpu, t_net_at, n_groups, cap, swap_budget) if g]
        if bounds is not None:
            groups = repair(groups, [float(x) for x in t_cpu - t_net_at], bounds, machines, cap)
            if not groups:
                continue
        group_of = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
        flat = np.fromiter((j for g in groups for j in g), dtype=np.int64, count=int(group_of.size))
        c1 = np.bincount(group_of, weights=t_cpu1[flat], minlength=len(groups)).astype(np.float64)
        nn = np.bincount(group_of, weights=t_net[flat], minlength=len(groups)).astype(np.float64)
        ll = np.bincount(group_of, weights=link[flat], minlength=len(groups)).astype(np.float64)
        if bounds is None:
            m = allocate_machines(c1, nn, machines, link=ll)
        else:
            lim = [bounds.group(grp) for grp in groups]
            m = allocate_machines(c1, nn, machines, [x[0] for x in lim], [x[1] for x in lim], ll)
        g = evaluate(t_cpu1, t_net, groups, m.tolist(), cpu_weight, machines, link)
        if refine_budget > 0 and n <= REFINE_LIMIT and machines <= REFINE_MACHINES:
            g = refine(t_cpu1, t_net, g, cap, refine_budget, cpu_weight, bounds, machines, link)
        if g.score > best.score:
            best = g
    return best


def schedule(t_cpu1: FloatArray, t_net: FloatArray, machines: int, cap: Optional[int] = None,
             linear_limit: int = LINEAR_LIMIT, growth: float = GROWTH, swap_budget: int = SWAP_BUDGET,
             cpu_weight: float = CPU_WEIGHT, patience: int = PATIENCE, refine_budget: int = REFINE_BUDGET,
             bounds: Optional[Bounds] = None, t_link: Optional[FloatArray] = None) -> Grouping:
    """Algorithm 1: group the first n_j jobs for growing n_j while the modelled utilization rises
    (see `PATIENCE`); the jobs are in priority order (the caller's), the result names them by index.
    `bounds`: per job the machines its group may have (a job no group can suit is left out)."""
    t_cpu1 = np.asarray(t_cpu1, dtype=np.float64)
    t_net = np.asarray(t_net, dtype=np.float64)
    n = len(t_cpu1)
    link = _links(t_link, n)
    limit = n if cap is None else min(n, machines * cap)
    if bounds is not None and bool(np.all(bounds.lo <= 1)) and bool(np.all(bounds.hi >= machines)):
        bounds = None       # none binds: the unbounded (vectorised) path, no repair
    best, best_n = EMPTY, 0
    misses = 0
    for nj in job_counts(limit, linear_limit, growth):
        g = group_jobs(t_cpu1[:nj], t_net[:nj], machines, cap, swap_budget, cpu_weight, refine_budget=refine_budget,
                       bounds=None if bounds is None else bounds.take(nj), t_link=link[:nj])
        if g.score > best.score:
            best, best_n = g, nj
            misses = 0
        else:
            misses += 1
            if misses > patience and nj >= best_n * PATIENCE_GROWTH:
                break
    return best


__all__ = ["EMPTY", "GROWTH", "Bounds", "Grouping", "LINEAR_LIMIT", "SWAP_BUDGET", "allocate_machines", "assign_jobs",
           "balance_groups", "evaluate", "group_jobs", "job_counts", "repair", "schedule"]
