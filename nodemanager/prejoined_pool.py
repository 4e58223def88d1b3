"""A pool of processes that joined a cgroup of their own before the launch that takes one.

Moving a process into a cgroup makes the kernel wait for an RCU grace period (its cgroup
threadgroup lock, taken for writing) unless another move happened just before: 15-20 ms of a
launch on this 2-core host (docs/internals.md, Containers). A pool pays that wait ahead: it keeps up
to `size` processes, each in a session of its own and already inside a limitless cgroup named
`<prefix><nm pid>-<token>-<n>` (the token random per pool: a name no earlier NM used), waiting; a
launch `take`s one, gives its cgroup the container's limits and name and hands it the container.
Two kinds share this bookkeeping: pre-started shells for cold launches
(nodemanager.container_shell_pool) and the executor zygote's spare children for warm ones
(nodemanager.warm_spares); each says how one of its processes starts and ends.

The pool refills once launches pause (REFILL_LULL_S after the last take): a process joining its
cgroup holds the kernel's cgroup locks while it waits, which would stall the renames and removals
of a burst's launches. A start that fails breaks the pool once (`broken` says why; launches then
join at launch time). `start` removes the empty cgroups of this kind a previous NM left; `close`
ends the idle processes and removes their cgroups.
"""
from __future__ import annotations

import abc
import asyncio
import collections
import logging
import os
import secrets
import time
from typing import Generic, Optional, Protocol, TypeVar

from protocol.errors import HostError

from .cgroup_base import CgroupBackend, ContainerCgroup

log = logging.getLogger(__name__)

REFILL_LULL_S = 0.05       # refill once no launch took a process for this long


class PrejoinedProcess(Protocol):
    """What the pool needs of one of its processes: its cgroup and whether it still runs."""

    cgroup: ContainerCgroup

    @property
    def alive(self) -> bool: ...


P = TypeVar("P", bound=PrejoinedProcess)


class PrejoinedPool(abc.ABC, Generic[P]):
    """Keeps up to `size` ready processes of one kind for a node's container manager (module doc)."""

    prefix: str = ""            # their cgroups' name prefix
    broken_message: str = ""    # logged with the reason when a start fails

    def __init__(self, backend: CgroupBackend, size: int) -> None:
        if size < 1:
            raise ValueError(f"{type(self).__name__} needs a size >= 1")
        self.backend = backend
        self.size = size
        self._ready: collections.deque[P] = collections.deque()
        self._seq = 0
        # In every cgroup name: v2 keeps these names for the containers launched in them, and a
        # restarted NM (the same pid in a new pid namespace, or a pid reused) must never make the
        # name of a cgroup that still holds a container it recovers (makedirs would join it).
        self._tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._refill: Optional[asyncio.Task[None]] = None
        self._closed = False
        self._last_take = float("-inf")
        self.broken = ""            # why the pool stopped making processes ("" = it did not)
        self.served = 0             # launches that took a ready process
        self.missed = 0             # launches that found none ready

    @abc.abstractmethod
    async def _start_one(self, cgroup_name: str) -> P:
        """Make the cgroup `cgroup_name`, start a process that joins it, return once it has
        (OSError or HostError: it could not, and nothing of it is left)."""

    @abc.abstractmethod
    async def _end(self, proc: P) -> None:
        """End one of the pool's processes and remove its cgroup."""

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def idle(self) -> tuple[P, ...]:
        """The processes waiting for a launch (some may have ended since: `take` skips those)."""
        return tuple(self._ready)

    def stats(self) -> dict[str, int | str]:
        """For the NM's node info: how many it keeps, has ready, and launches served or not."""
        return {"size": self.size, "ready": self.ready, "served": self.served, "missed": self.missed,
                "broken": self.broken}

    async def start(self) -> None:
        """Remove the empty cgroups of this kind a previous NM left behind (their processes exited
        with it), then fill the pool in the background."""
        await asyncio.to_thread(self.backend.remove_empty, self.prefix)
        self._kick()

    def take(self) -> Optional[P]:
        """A ready process (the pool refills behind it, once launches pause), or None."""
        self._last_take = time.monotonic()
        while self._ready:
            proc = self._ready.popleft()
            if proc.alive:
                self.served += 1
                self._kick()
                return proc
            self.backend.try_remove(proc.cgroup)   # ended while idle (killed from outside)
        self.missed += 1
        self._kick()
        return None

    async def close(self) -> None:
        """Stop refilling, end every idle process and remove its cgroup."""
        self._closed = True
        if self._refill is not None:
            # Not cancelled: a process being started would outlive the task and leave its cgroup
            # behind; the refill sees `_closed` once that process is up and ends it.
            try:
                await self._refill
            except Exception:   # noqa: BLE001 - it logged its own failure
                pass
        idle, self._ready = list(self._ready), collections.deque()
        for proc in idle:
            await self._end(proc)

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
            try:
                proc = await self._start_one(f"{self.prefix}{self._tag}-{self._seq}")
            except (OSError, HostError) as e:     # CgroupError is an OSError
                self.broken = str(e)
                log.warning("%s: %s", self.broken_message, e)
                return
            if self._closed:
                await self._end(proc)
                return
            self._ready.append(proc)


__all__ = ["PrejoinedPool", "PrejoinedProcess", "REFILL_LULL_S"]
