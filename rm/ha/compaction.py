"""When the active RM compacts etcd's history, so etcd's database does not grow without end.

etcd keeps every revision of every key until it is compacted. The RM rewrites its apps' records and
its policy's state (up to megabytes: rm/ha/etcd_store.py) as they change, so without compaction
etcd's database grows until its backend quota (2 GiB by default) raises the NOSPACE alarm and etcd
refuses every write, the state store's too: 200 writes of a 500 KB state took a test etcd's
database to 96 MB. YARN's ZooKeeper store keeps only the current data; on etcd somebody has to
compact. Like Kubernetes' API server (`--etcd-compaction-interval`, 5 minutes), the active RM
compacts every `interval_s` to the revision it saw one interval before: the last interval's history
stays, so a read pinned at a revision seconds old (the store reads a large policy state's parts at
its index's revision) is never compacted from under it. Freed pages are reused by etcd's backend, so
the database stays near the size of the live keys plus one interval of writes. An operator who runs
etcd with its own `--auto-compaction-retention` may turn this off (`[ha] compaction_interval_s = 0`).

`CompactionSchedule` is the pure part: revisions seen over time in, the revision to compact to out.
"""
from __future__ import annotations

from typing import Optional

from protocol.ha_config import COMPACTION_INTERVAL_S


class CompactionSchedule:
    """Which revision to compact to, and when (module doc); time is an argument."""

    def __init__(self, interval_s: float = COMPACTION_INTERVAL_S) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0 (0: off), got {interval_s}")
        self.interval_s = interval_s
        self._mark: Optional[tuple[float, int]] = None      # (when, the revision seen then)
        self.compacted = 0                                   # the last revision compacted to

    def reset(self) -> None:
        """Forget what was seen (a new term: its first interval starts now)."""
        self._mark = None

    def observe(self, now: float, revision: int) -> Optional[int]:
        """`revision` is etcd's at `now`: the revision to compact to now (the one seen an interval
        or more ago, if newer than the last compacted), else None."""
        if self.interval_s <= 0:
            return None
        if self._mark is None:
            self._mark = (now, revision)
            return None
        when, seen = self._mark
        if now - when < self.interval_s:
            return None
        self._mark = (now, revision)
        if seen <= self.compacted:
            return None
        self.compacted = seen
        return seen


__all__ = ["COMPACTION_INTERVAL_S", "CompactionSchedule"]
