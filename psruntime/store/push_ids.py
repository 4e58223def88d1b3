"""Idempotent pushes: a mini-batch's pushes carry an id, and a server applies each id once per block.

When a worker is lost in the middle of a BSP clock, its replacement runs the whole clock again
from where it began (appmaster.ps.recovery). Some of that clock's mini-batches were pushed already,
some only to a part of their servers (the worker died half-way through a push). So every push of a
training mini-batch carries one int, its *push id*, unique per (input split, epoch, first row of
the batch, kind of push: the model deltas or the audit count), and every server remembers, per
model block, the ids it applied: a repeated id is acknowledged without being applied. Per block,
not per server, so a request that is partly redirected (its other blocks moved) is still right.

A server keeps the ids of the latest two epochs it has seen (the current and the previous one:
a clock is redone within its own epoch) and forgets older ones. A block's ids travel with it when
it migrates (StoreService's block_data frame), so a block moving while a worker is lost mid-clock
still drops the redone pushes it already holds (parts queued at the destination while the block is
on its way are judged when it has arrived, with its ids); a block restored from a checkpoint forgets its ids
(the epochs after the checkpoint are trained again and must apply).

The wire is one int in the push's header (`PUSH_ID_FIELD`). Pushes without it (initialisation,
the AM's own updates) are always applied.
"""
from __future__ import annotations

from typing import Iterable, Optional

PUSH_ID_FIELD = "push_id"       # header field of an update request: the push id (an int)

KIND_BITS, ROW_BITS, SPLIT_BITS, EPOCH_BITS = 1, 26, 18, 18     # 63 bits in all: a positive int64
DELTAS, COUNT = 0, 1            # the kinds of push of one mini-batch


def push_id(split: int, epoch: int, start_row: int, kind: int = DELTAS) -> Optional[int]:
    """The id of one push of a mini-batch, or None when a field is out of range (such a push is
    simply not deduplicated: a job with over 2**18 epochs or splits, or 2**26 rows per split)."""
    if not (0 <= split < 1 << SPLIT_BITS and 0 <= epoch < 1 << EPOCH_BITS and 0 <= start_row < 1 << ROW_BITS
            and kind in (DELTAS, COUNT)):
        return None
    return (((epoch << SPLIT_BITS | split) << ROW_BITS | start_row) << KIND_BITS) | kind


def epoch_of(pid: int) -> int:
    return pid >> (KIND_BITS + ROW_BITS + SPLIT_BITS)


class AppliedPushes:
    """The push ids a server applied, per model block, for the latest two epochs (see the module
    doc). Per id one int, a bit mask of the blocks it was applied to: memory grows with the
    mini-batches of two epochs, not with their blocks."""

    def __init__(self) -> None:
        self._ids: dict[int, dict[int, int]] = {}      # epoch -> push id -> mask of blocks applied
        self.newest = -1                                # the latest epoch seen
        self.repeats = 0                                # parts acknowledged without applying

    def first_time(self, pid: int, block: int) -> bool:
        """Record that `pid`'s part for `block` is applied now; False if it was applied before
        (the caller acknowledges it and applies nothing)."""
        epoch = epoch_of(pid)
        if epoch > self.newest:
            self.newest = epoch
            for old in [e for e in self._ids if e < epoch - 1]:
                del self._ids[old]
        elif epoch < self.newest - 1:
            return True         # older than anything remembered: apply (a redo never reaches back so far)
        ids = self._ids.get(epoch)
        if ids is None:
            ids = self._ids[epoch] = {}
        mask, bit = ids.get(pid, 0), 1 << block
        if mask & bit:
            self.repeats += 1
            return False
        ids[pid] = mask | bit
        return True

    def export(self, block: int) -> list[int]:
        """The ids remembered for `block` (they go with it when it migrates)."""
        bit = 1 << block
        return sorted(pid for ids in self._ids.values() for pid, mask in ids.items() if mask & bit)

    def import_ids(self, block: int, ids: Iterable[int]) -> None:
        """Remember ids that `block` was applied with elsewhere (it migrated here)."""
        repeats = self.repeats
        for pid in ids:
            self.first_time(int(pid), block)
        self.repeats = repeats            # what the block brings along is no repeat

    def forget(self, blocks: Iterable[int]) -> None:
        """Forget what `blocks` were applied with (their contents were replaced, e.g. restored)."""
        keep = ~sum(1 << b for b in set(blocks))
        self._ids = {e: kept for e, ids in self._ids.items()
                     if (kept := {pid: m for pid, mask in ids.items() if (m := mask & keep)})}
        self.newest = max(self._ids, default=-1)

    def __len__(self) -> int:
        """(id, block) pairs remembered."""
        return sum(bin(mask).count("1") for ids in self._ids.values() for mask in ids.values())
