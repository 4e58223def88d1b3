"""Spill of one worker's input blocks (Harmony §4.3.3): what `AppRole` does when the job asks for it.

The job spec's `spill_alpha` (a fixed ratio, or "auto") reaches every executor with `app_setup`.
A worker then

- generates (or reads) its partition one block at a time, spilling each disk block as soon as it
  is made, so a partition larger than the container's memory never is in memory at once; with
  "auto" the initial alpha comes from the first block's sampled size, the model's size and the
  process's RSS against the container's memory limit (`CONTAINER_MEMORY_MB`);
- trains with its `BlockReloader` as the pipeline's residency (disk blocks reloaded ahead of use);
- after each step (a clock) measures the step's load stall time and the memory its container is
  charged with (`memory_reading.ContainerMemory`: the container's cgroup where the NM enforces
  the limit with one, else /proc/self/statm's RSS) and, with "auto", lets its `AlphaTuner` move
  alpha for the next step.

Its figures (alpha, bytes spilled, stall seconds, loads) go into the step replies and the
executor's status, from which the AM builds the job report's `alpha` and `spilled_mb`.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Iterable, Literal, Sequence, Union

import msgspec

from protocol import container_env
from psruntime.spill.alpha_tuner import AlphaTuner, SpillMeasurement, initial_alpha, quantize
from psruntime.apps.base import PSApp
from psruntime.apps.blocks import DataBlock
from psruntime.spill.block_reloader import BlockReloader
from psruntime.spill.memory_reading import ContainerMemory
from psruntime.spill.spill_store import SpillStore
from psruntime.store.store_client import StoreClient
from psruntime.training_pipeline import init_blocks

SpillMode = Union[float, Literal["auto"]]
log = logging.getLogger(__name__)
WARMUP_STEPS = 1        # the first step fills the reload pipeline: its stall is not the alpha's


def container_limit_bytes(cgroup_limit: int = 0) -> int:
    """The container's memory limit: its environment's (`CONTAINER_MEMORY_MB`), or its cgroup's
    where that is tighter (or the only one known); 0: not in a container / unknown."""
    mb = os.environ.get(container_env.CONTAINER_MEMORY_MB, "")
    env = int(mb) * 2**20 if mb.isdigit() else 0
    known = [x for x in (env, cgroup_limit) if x > 0]
    return min(known) if known else 0


def parse_mode(value: object) -> SpillMode | None:
    """`spill_alpha` as app_setup carries it (any value, checked here): None (no spill), a ratio in
    [0, 1] or "auto"."""
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return float(value)
    raise ValueError(f"spill_alpha must be a number in [0, 1] or \"auto\", got {value!r}")


class WorkerSpill:
    """The spill side of one worker: its reloader, its tuner (with "auto") and its figures."""

    def __init__(self, mode: SpillMode, store: SpillStore | None = None, limit_bytes: int | None = None,
                 rss: Callable[[], int] | None = None, clock: Callable[[], float] = time.perf_counter,
                 prefetch: int = 1) -> None:
        self.mode = mode
        # Read from the container's cgroup where it has one: see memory_reading for why not RSS.
        memory = ContainerMemory()
        self.limit_bytes = container_limit_bytes(memory.limit_bytes()) if limit_bytes is None else limit_bytes
        self.rss: Callable[[], int] = memory if rss is None else rss
        self.reloader = BlockReloader(store or SpillStore(), 0.0 if mode == "auto" else float(mode),
                                      prefetch=prefetch, clock=clock)
        self.tuner: AlphaTuner | None = None
        self._stall_seen = 0.0
        self.peak_rss = 0

    @property
    def alpha(self) -> float:
        return self.reloader.alpha

    def load_blocks(self, app: PSApp[msgspec.Struct, msgspec.Struct], indices: Iterable[int]) -> list[DataBlock]:
        """Input blocks `indices` (in order), each disk block spilled as soon as it is made."""
        wanted = list(indices)
        blocks: list[DataBlock] = []
        for pos, idx in enumerate(wanted):
            block = app.input_block(idx)
            if pos == 0 and self.mode == "auto":
                self._choose_initial_alpha(app, block, len(wanted))
            self.reloader.admit(len(wanted), pos, block)
            blocks.append(block)
        app.release_generation_caches()
        return blocks

    def _choose_initial_alpha(self, app: PSApp[msgspec.Struct, msgspec.Struct], sample: DataBlock, num_blocks: int) -> None:
        """alpha from the sampled first block (times the partition's blocks), the worker-local state
        the app adds to its data (it never spills), the model and this process against the limit."""
        data = sample.nbytes * num_blocks
        state = max(0, app.data_nbytes() * num_blocks // max(app.num_blocks, 1) - data)
        alpha = initial_alpha(data, sample.nbytes, app.model_nbytes(), self.rss() + state,
                              self.limit_bytes, num_blocks, prefetch=self.reloader.prefetch)
        self.reloader.alpha = alpha
        self.tuner = AlphaTuner(alpha, num_blocks=num_blocks, warmup=WARMUP_STEPS)

    async def init_blocks(self, store: StoreClient, app: PSApp[msgspec.Struct, msgspec.Struct], blocks: Sequence[DataBlock]) -> None:
        """`training_pipeline.init_blocks` a block at a time, each disk block loaded for it."""
        self.reloader.plan(blocks)
        for b in blocks:
            await self.reloader.acquire(b)
            await init_blocks(store, app, [b])
            self.reloader.release(b)

    def after_step(self, blocks: Sequence[DataBlock], step_s: float) -> dict[str, float | None]:
        """Measure the step just run; with "auto", move alpha for the next one. Returns the
        figures for the step's reply."""
        stall = self.reloader.stall_s - self._stall_seen
        self._stall_seen = self.reloader.stall_s
        rss = self.rss()
        self.peak_rss = max(self.peak_rss, rss)
        if self.tuner is None and self.mode == "auto":
            self.tuner = AlphaTuner(quantize(self.alpha, len(blocks)), num_blocks=len(blocks), warmup=WARMUP_STEPS)
        if self.tuner is not None and blocks:
            self.tuner.num_blocks = len(blocks)
            m = SpillMeasurement(step_s, stall, rss, self.limit_bytes)
            alpha = self.tuner.observe(m)
            if alpha != self.alpha:
                log.info("spill: alpha %.3f -> %.3f (memory %.1f MB = %.0f%% of the limit, stall %.3fs of %.3fs)",
                         self.alpha, alpha, rss / 2**20, 100 * m.pressure, stall, step_s)
                self.reloader.set_alpha(blocks, alpha)
        return {**self.figures(), "step_stall_s": stall}

    @property
    def wants_model_spill(self) -> bool:
        return self.tuner is not None and self.tuner.wants_model_spill

    def figures(self) -> dict[str, float | None]:
        r = self.reloader
        return {"alpha": self.alpha, "spilled_bytes": r.store.nbytes(), "stall_s": r.stall_s, "loads": r.loads,
                "disk_blocks": len(r.disk), "peak_rss_bytes": self.peak_rss}

    def close(self) -> None:
        self.reloader.close()
