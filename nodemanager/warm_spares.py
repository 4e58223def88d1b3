"""Spare warm children: the cgroup join taken off a warm (zygote) launch's path.

A warm launch (nodemanager.warm_launcher) forks the container's process from the executor zygote,
and the child moves itself into the container's cgroups before it runs anything. That move waits
for an RCU grace period on most hosts (the kernel's cgroup threadgroup lock, taken for writing):
measured in the EPS add of bench/eps_overhead.py, the zygote's part of a launch took 12-29 ms of
which the fork is a few. The cold path has the same wait and the pre-started shells of
nodemanager.container_shell_pool to take it off; this is their counterpart for the zygote: the pool
keeps a few children forked ahead, each in a session of its own and already inside a cgroup of its
own (made without limits), waiting for a launch (protocol.zygote_wire.WarmSpare). A launch takes
one, gives its cgroup the container's limits (v1 also renames it to the container id; v2 keeps the
`warm-N` name, which the container's record names) and sends the WarmLaunch naming it: the child
sets up the container's log files, dir and environment and runs the module, with no cgroup move.

A launch the pool has no live spare for, or whose spare cannot take it, forks a fresh child as before.
The pool refills once launches pause (a spare's own join holds the kernel's cgroup lock meanwhile,
which would stall the renames and removals of a burst's launches), and at close the zygote's spares
exit as it closes; their cgroups are removed here.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import time
from typing import Optional

from .cgroup_base import CgroupBackend, ContainerCgroup
from .warm_launcher import WarmLauncher, WarmLaunchError

log = logging.getLogger(__name__)

NAME_PREFIX = "warm-"
REFILL_LULL_S = 0.05       # refill once no launch took a spare for this long
EXIT_WAIT_S = 5.0          # a killed spare's exit, before its cgroup is removed


class WarmSpare:
    """One spare child of the zygote: its pid, its exit (set when the zygote reaps it), its cgroup."""

    def __init__(self, pid: int, exited: "asyncio.Future[int]", cgroup: ContainerCgroup) -> None:
        self.pid = pid
        self.exited = exited
        self.cgroup = cgroup

    @property
    def alive(self) -> bool:
        return not self.exited.done()


class WarmSparePool:
    """Keeps up to `size` spares of `warm`'s zygote for a node's container manager (module doc)."""

    def __init__(self, backend: CgroupBackend, warm: WarmLauncher, size: int) -> None:
        if size < 1:
            raise ValueError("a spare pool needs a size >= 1")
        self.backend = backend
        self.warm = warm
        self.size = size
        self._ready: collections.deque[WarmSpare] = collections.deque()
        self._seq = 0
        self._refill: Optional[asyncio.Task[None]] = None
        self._closed = False
        self._last_take = float("-inf")
        self.broken = ""            # why the pool stopped making spares ("" = it did not)
        self.served = 0             # warm launches that took a spare
        self.missed = 0             # warm launches that found none

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def idle(self) -> tuple[WarmSpare, ...]:
        """The spares waiting for a launch (some may have ended since: `take` skips those)."""
        return tuple(self._ready)

    def stats(self) -> dict[str, int | str]:
        """For the NM's node info: how many spares it keeps, has ready, and launches served or not."""
        return {"size": self.size, "ready": self.ready, "served": self.served, "missed": self.missed,
                "broken": self.broken}

    async def start(self) -> None:
        """Remove spare cgroups a previous NM left behind (their spares exited with its zygote),
        then fill the pool in the background."""
        await asyncio.to_thread(self.backend.remove_empty, NAME_PREFIX)
        self._kick()

    def take(self) -> Optional[WarmSpare]:
        """A live spare (the pool refills behind it, once launches pause), or None: fork afresh."""
        self._last_take = time.monotonic()
        while self._ready:
            spare = self._ready.popleft()
            if spare.alive:
                self.served += 1
                self._kick()
                return spare
            self.backend.try_remove(spare.cgroup)   # ended while idle (killed from outside)
        self.missed += 1
        self._kick()
        return None

    async def discard(self, spare: WarmSpare) -> None:
        """A taken spare the launch could not use: end it and remove its cgroup."""
        try:
            os.killpg(spare.pid, signal.SIGKILL)     # it leads its own session
        except OSError:
            pass
        try:
            async with asyncio.timeout(EXIT_WAIT_S):
                await asyncio.shield(spare.exited)
        except (asyncio.TimeoutError, WarmLaunchError):
            pass        # the zygote is gone: the kernel refuses the removal if the spare lives on
        if not await asyncio.to_thread(self.backend.try_remove, spare.cgroup):
            log.warning("could not remove spare cgroup %s (processes remain: %s)",
                        spare.cgroup.dirs, self.backend.pids(spare.cgroup))

    async def close(self) -> None:
        """Stop refilling, end every idle spare and remove its cgroup (before the zygote closes)."""
        self._closed = True
        if self._refill is not None:
            # Not cancelled: a spare being started would outlive the task and leave its cgroup
            # behind; the refill sees `_closed` once that spare is up and ends it.
            try:
                await self._refill
            except Exception:   # noqa: BLE001 - it logged its own failure
                pass
        idle, self._ready = list(self._ready), collections.deque()
        for spare in idle:
            await self.discard(spare)

    # ----- filling ------------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._closed or self.broken or (self._refill is not None and not self._refill.done()):
            return
        if len(self._ready) < self.size:
            self._refill = asyncio.get_running_loop().create_task(self._fill())

    async def _fill(self) -> None:
        # (ASYNC110: a deadline each take moves, not a condition to await)
        while (wait := self._last_take + REFILL_LULL_S - time.monotonic()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(wait)
        while not self._closed and len(self._ready) < self.size:
            self._seq += 1
            # The NM's pid in the name: a restarted NM must not reuse a cgroup (v2 keeps spare
            # names) that still holds a container it recovers.
            name = f"{NAME_PREFIX}{os.getpid()}-{self._seq}"
            try:
                cg = await asyncio.to_thread(self.backend.make, name)
            except OSError as e:     # CgroupError is an OSError
                self._broke(str(e))
                return
            try:
                pid, exited = await self.warm.spare(self.backend.join_files(cg))
            except WarmLaunchError as e:
                await asyncio.to_thread(self.backend.try_remove, cg)
                self._broke(str(e))
                return
            spare = WarmSpare(pid, exited, cg)
            if self._closed:
                await self.discard(spare)
                return
            self._ready.append(spare)

    def _broke(self, why: str) -> None:
        self.broken = why
        log.warning("no spare warm children (warm containers join their cgroups at launch): %s", why)

__all__ = ["NAME_PREFIX", "WarmSpare", "WarmSparePool"]
