"""Runs the utilization sampler on its own period, in a worker thread, and keeps the latest sample
for the heartbeat (which only reads it, so measuring never delays a heartbeat) and the NM's
Prometheus exposition."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

import msgspec

from protocol.internal_api import NodeUtilization

from .container_manager import ContainerManager
from .container_state import NMContainerState
from .utilization_sampler import ContainerProbe, UtilizationSampler

log = logging.getLogger(__name__)

# Heartbeats may come faster (a local cluster's 250 ms): they resend the latest sample, and the
# RM keeps one point a second anyway; a /proc scan without cgroups is not free.
MIN_INTERVAL_S = 1.0
CONTAINER_LIST_EVERY_S = 5.0   # heartbeats carry the per-container list at least this often


class UtilizationMonitor:
    """Samples every `interval_s` while started; `latest` is None until the first sample."""

    def __init__(self, manager: ContainerManager, sampler: UtilizationSampler, interval_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.manager = manager
        self.sampler = sampler
        self.interval_s = max(MIN_INTERVAL_S, interval_s)
        self.clock = clock
        self.latest: Optional[NodeUtilization] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._listed: frozenset[str] = frozenset()   # the containers of the last list sent
        self._listed_at = float("-inf")

    def for_heartbeat(self) -> Optional[NodeUtilization]:
        """The latest sample as the next heartbeat sends it: with the per-container list when the
        set of containers changed or CONTAINER_LIST_EVERY_S passed since the last list, else with
        the sums only (the RM keeps the last list)."""
        u = self.latest
        if u is None:
            return None
        ids = frozenset(c.container_id for c in u.containers or ())
        now = self.clock()
        if ids != self._listed or now - self._listed_at >= CONTAINER_LIST_EVERY_S:
            self._listed, self._listed_at = ids, now
            return u
        return msgspec.structs.replace(u, containers=None)

    def probes(self) -> list[ContainerProbe]:
        """The running containers with a process to measure."""
        return [ContainerProbe(c.container_id, c.app_id, c.pid, c.work_dir, c.cgroup, c.role)
                for c in self.manager.containers.values() if c.state is NMContainerState.RUNNING and c.pid]

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                self.latest = await asyncio.to_thread(self.sampler.sample, self.probes())
            except Exception:  # one bad read must not end the measurements
                log.exception("utilization sample failed")
            await asyncio.sleep(self.interval_s)   # a sampling period, not a readiness wait

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
