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
Refilling, stale cgroups and closing are nodemanager.prejoined_pool's, as for the shells.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal

from .cgroup_base import CgroupBackend, ContainerCgroup
from .prejoined_pool import PrejoinedPool
from .warm_launcher import WarmLauncher, WarmLaunchError

log = logging.getLogger(__name__)

NAME_PREFIX = "warm-"
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


class WarmSparePool(PrejoinedPool[WarmSpare]):
    """Keeps up to `size` spares of `warm`'s zygote for a node's container manager (module doc;
    the pool's bookkeeping is nodemanager.prejoined_pool)."""

    prefix = NAME_PREFIX
    broken_message = "no spare warm children (warm containers join their cgroups at launch)"

    def __init__(self, backend: CgroupBackend, warm: WarmLauncher, size: int) -> None:
        super().__init__(backend, size)
        self.warm = warm

    async def discard(self, spare: WarmSpare) -> None:
        """A taken spare the launch could not use: end it and remove its cgroup."""
        if not spare.exited.done():     # reaped once reported: its number may be someone else's now
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

    async def _end(self, spare: WarmSpare) -> None:
        await self.discard(spare)

    async def _start_one(self, cgroup_name: str) -> WarmSpare:
        cg = await asyncio.to_thread(self.backend.make, cgroup_name)
        try:
            pid, exited = await self.warm.spare(self.backend.join_files(cg))
        except WarmLaunchError:
            await asyncio.to_thread(self.backend.try_remove, cg)
            raise
        return WarmSpare(pid, exited, cg)


__all__ = ["NAME_PREFIX", "WarmSpare", "WarmSparePool"]
