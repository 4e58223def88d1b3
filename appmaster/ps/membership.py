"""Which executors take part in a PS job's training: the workers in the BSP barrier (EPS's clock
list, in partition order) and the servers that serve model blocks.

One owner for both lists: setup and restarts `set` them, elastic changes add and remove members
through the methods here, and everyone else reads copies. Before the first `set` the lists are the
pool's READY executors of each role (a job that is still starting).
"""
from __future__ import annotations

from typing import Iterable, Optional

from .runtime.executor_pool import ExecutorPool, ExecutorRecord, ExecutorState, Role, by_index


class Membership:
    """The job's workers (the BSP barrier) and servers; see the module doc."""

    def __init__(self, pool: ExecutorPool) -> None:
        self.pool = pool
        self._workers: Optional[list[ExecutorRecord]] = None
        self._servers: Optional[list[ExecutorRecord]] = None

    @property
    def workers(self) -> list[ExecutorRecord]:
        """The workers in the BSP barrier, in partition order (a copy)."""
        if self._workers is None:
            return by_index(self.pool.of_role(Role.WORKER, ExecutorState.READY))
        return list(self._workers)

    @property
    def servers(self) -> list[ExecutorRecord]:
        """The servers that serve (or are about to serve) model blocks (a copy)."""
        if self._servers is None:
            return by_index(self.pool.of_role(Role.SERVER, ExecutorState.READY))
        return list(self._servers)

    def worker_ids(self) -> list[str]:
        return [w.executor_id for w in self.workers]

    def server_ids(self) -> list[str]:
        return [s.executor_id for s in self.servers]

    def shape(self) -> tuple[int, int]:
        """(workers, servers) taking part now."""
        return len(self.workers), len(self.servers)

    def set(self, servers: Iterable[ExecutorRecord], workers: Iterable[ExecutorRecord]) -> None:
        """The job's executors from now on (setup, a restart): workers keep the given order."""
        self._servers = by_index(servers)
        self._workers = list(workers)

    def add_workers(self, recs: Iterable[ExecutorRecord]) -> None:
        """`recs` join the barrier from the next clock."""
        have = {w.executor_id for w in self.workers}
        self._workers = by_index(self.workers + [r for r in recs if r.executor_id not in have])

    def remove_workers(self, ids: Iterable[str]) -> None:
        gone = set(ids)
        self._workers = [w for w in self.workers if w.executor_id not in gone]

    def set_workers(self, recs: Iterable[ExecutorRecord]) -> None:
        """The barrier is exactly `recs` (by index), e.g. the workers holding active splits."""
        self._workers = by_index(recs)

    def add_servers(self, recs: Iterable[ExecutorRecord]) -> None:
        have = {s.executor_id for s in self.servers}
        self._servers = by_index(self.servers + [r for r in recs if r.executor_id not in have])

    def remove_servers(self, ids: Iterable[str]) -> None:
        gone = set(ids)
        self._servers = [s for s in self.servers if s.executor_id not in gone]
