"""The disk block ratio alpha of a worker's input (dissertation §4.3.3), pure: no I/O, no clock.

alpha is the fraction of a worker's input blocks kept on disk (reloaded ahead of use, dropped after).
A higher alpha costs load stalls (and the CPU of decompression); a lower one costs memory, and in a
container with a hard limit memory pressure ends in a kill (-104), the Python analogue of the
paper's GC overhead. So:

- `initial_alpha`: from the sampled bytes of the input blocks and the model against the container's
  memory limit: the smallest alpha whose memory blocks fit the budget left after the process's own
  footprint, the model working set and the blocks in flight.
- `AlphaTuner`: hill climbing on a measured cost per clock, the stall fraction (load stall time over
  step time) plus a pressure penalty that is 0 below `soft` x limit and grows quadratically to
  `PRESSURE_WEIGHT` at `hard` x limit. It moves alpha one step in its direction, keeps the move when
  the cost fell and otherwise goes back, turns round and halves the step. At or past `hard` it
  raises alpha at once, whatever the stalls; `wants_model_spill` says alpha is 1 and the pressure
  is still there (the servers' model blocks are next).

Departure from §4.3.3's pure hill climbing, for Python: the climb moves only where there is
something to win. Below `soft` with stalls under `stall_tolerance` of the step, no alpha is
measurably better -- CPython has no tracing GC whose overhead falls as memory is freed, and a
lower alpha saves only the decompression of a few blocks (bench/harmony_spill.py: the executors'
CPU seconds differ by ~12 % between alpha 0.25 and 1) -- while every move costs (blocks loaded to
become memory blocks) and a climb that drifts down on noise walks into the band near the limit
(before this rule: 89 % of the container's cgroup), where the next step may be the kill. So there
it holds; above `soft` it raises alpha (memory there has no upside); only stalls
over the tolerance start the climb, which then trades them against pressure as before.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

PRESSURE_WEIGHT = 4.0
SOFT_PRESSURE = 0.70
HARD_PRESSURE = 0.88
STALL_TOLERANCE = 0.05      # stalls under this fraction of a step are not worth a move


@dataclass(frozen=True)
class SpillMeasurement:
    """What a worker measured over one step (a clock) at its current alpha."""

    step_s: float          # wall time of the step
    stall_s: float         # of which waiting for disk blocks not yet loaded
    rss_bytes: int         # resident set size at the end of the step
    limit_bytes: int       # the container's memory limit (0: none known)

    @property
    def pressure(self) -> float:
        """RSS over the limit (0 when no limit is known)."""
        return self.rss_bytes / self.limit_bytes if self.limit_bytes > 0 else 0.0


def quantize(alpha: float, num_blocks: int) -> float:
    """`alpha` rounded up to a whole number of disk blocks out of `num_blocks`."""
    alpha = min(1.0, max(0.0, alpha))
    if num_blocks <= 0:
        return alpha
    return math.ceil(alpha * num_blocks - 1e-9) / num_blocks


def initial_alpha(data_bytes: int, block_bytes: int, model_bytes: int, base_rss_bytes: int,
                  limit_bytes: int, num_blocks: int, target: float = SOFT_PRESSURE, prefetch: int = 1) -> float:
    """The smallest alpha whose memory blocks fit `target` x `limit_bytes` beside the process
    (`base_rss_bytes`), the model working set (`model_bytes`: pulled values and deltas of a
    mini-batch, at most the whole model) and the blocks in flight (the one in use and `prefetch`
    loading, `block_bytes` each, plus one decompression buffer). `data_bytes` is the sampled size of
    all the worker's blocks. 0 when no limit is known or everything fits."""
    if limit_bytes <= 0 or data_bytes <= 0:
        return 0.0
    budget = target * limit_bytes - base_rss_bytes - model_bytes - (prefetch + 2) * block_bytes
    if budget >= data_bytes:
        return 0.0
    return quantize(1.0 - max(budget, 0.0) / data_bytes, num_blocks)


class AlphaTuner:
    """Hill climbing on alpha between load stalls and memory pressure (see the module doc).

    `observe(m)` takes the measurement of one step run at `alpha` and returns the alpha for the
    next step. Measurements are averaged over `window` steps before each decision.
    """

    def __init__(self, alpha: float, step: float = 0.125, min_step: float = 1 / 64, window: int = 2,
                 soft: float = SOFT_PRESSURE, hard: float = HARD_PRESSURE, num_blocks: int = 0,
                 stall_tolerance: float = STALL_TOLERANCE, warmup: int = 0) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if not 0.0 < soft < hard:
            raise ValueError(f"need 0 < soft < hard, got soft {soft} hard {hard}")
        self.num_blocks = num_blocks
        self.alpha = quantize(alpha, num_blocks)
        self.step = max(step, self._grain())
        self.min_step = max(min_step, self._grain())
        self.window = max(1, window)
        self.soft, self.hard = soft, hard
        self.stall_tolerance = stall_tolerance
        # The first steps fill the pipeline (no disk block was prefetched for the first one): their
        # stalls say nothing about alpha, so they are not measured (only the hard limit acts).
        self._warmup = max(0, warmup)
        self.direction = -1.0            # start by trying fewer disk blocks: less reloading
        self._pending: list[SpillMeasurement] = []
        self._best: tuple[float, float] | None = None    # (alpha, cost) the climb stands on
        self._pressed_at_full = False

    def _grain(self) -> float:
        return 1.0 / self.num_blocks if self.num_blocks > 0 else 0.0

    @staticmethod
    def stall_fraction(m: SpillMeasurement) -> float:
        return m.stall_s / m.step_s if m.step_s > 0 else 0.0

    def cost(self, m: SpillMeasurement) -> float:
        """Stall fraction plus the pressure penalty of one measurement."""
        over = max(0.0, m.pressure - self.soft) / (self.hard - self.soft)
        return self.stall_fraction(m) + PRESSURE_WEIGHT * over * over

    @property
    def wants_model_spill(self) -> bool:
        """The last step already ran at alpha 1 and was still at the hard pressure limit."""
        return self._pressed_at_full

    def _move(self, to: float) -> float:
        self.alpha = quantize(to, self.num_blocks)
        return self.alpha

    def observe(self, m: SpillMeasurement) -> float:
        self._pressed_at_full = self.alpha >= 1.0 and m.pressure >= self.hard
        if m.pressure >= self.hard:
            # Near the kill: more disk blocks now, and the climb starts over from there.
            self._pending.clear()
            self._best = None
            self.direction = 1.0
            return self._move(self.alpha + 2 * self.step)
        if self._warmup > 0:
            self._warmup -= 1
            return self.alpha
        self._pending.append(m)
        if len(self._pending) < self.window:
            return self.alpha
        window = self._pending
        self._pending = []
        cost = sum(self.cost(x) for x in window) / len(window)
        pressure = max(x.pressure for x in window)
        stall = sum(self.stall_fraction(x) for x in window) / len(window)
        if pressure > self.soft:
            # Over the memory target: up, whatever the climb said (in Python memory there buys
            # nothing); a climb that comes back starts from here.
            self.direction = 1.0
            self._best = None
            return self._move(self.alpha + self.step)
        if stall <= self.stall_tolerance:
            # Nothing to win by moving: stay. Stalls that come later start a climb from here,
            # downwards (fewer disk blocks, fewer loads to wait for).
            self._best = None
            self.direction = -1.0
            return self.alpha
        if self._best is None or cost < self._best[1]:
            self._best = (self.alpha, cost)          # the move paid: keep going that way
        else:
            # Worse than where we stood: back there, the other way, smaller steps.
            self.direction = -self.direction
            self.step = max(self.min_step, self.step / 2)
            self._move(self._best[0])
            self._best = (self.alpha, self._best[1])
        nxt = self.alpha + self.direction * self.step
        if not 0.0 <= nxt <= 1.0:
            self.direction = -self.direction
            nxt = self.alpha + self.direction * self.step
        return self._move(nxt)
