"""What one worker pushed since the job's latest checkpoint, summed by key: a lost server's blocks
are the checkpoint's plus every worker's sums for them (docs/internals.md, "PS jobs": a lost
server rebuilt without going back). Sans-I/O: the app role records and asks, nothing here sends.

Every push of a training mini-batch is an "add" of deltas (psruntime.training_pipeline), and
after the checkpoint nothing else writes the model, so for any block

    model now = model at the checkpoint + sum over workers of what each pushed to it since

-- counting only clocks the AM has counted. The clock a server was lost in is run again from where
it began: its pushes that reached the surviving servers are dropped there by push id, and the
rebuilt blocks get them from the run again, not from the log. So pushes are kept per clock
(`record`, tagged with the clock's number, the AM's count of clocks done when it began) and folded
into the sums only once a later clock begins (`begin_clock`: the AM counted the earlier one); a
clock begun again under the same number replaces what its first run recorded.

A checkpoint's cut resets the sums (`reset`, with the cut's clock count). Should pushes of a clock
after the cut have been folded already, the sums can no longer be split at the cut: the log is not
`whole` until the next checkpoint, and a lost server then takes the checkpoint path.
"""
from __future__ import annotations

from typing import Union

import numpy as np

from psruntime.store.ownership_table import blocks_of_int_keys, block_of

Keys = Union[np.ndarray, str]       # a mini-batch's int key array, or the audit count's name


class PushLog:
    """The sums of one worker's pushes since the latest checkpoint (module doc)."""

    def __init__(self, num_keys: int, since: int = 0, fresh: bool = True) -> None:
        self.num_keys = num_keys
        # The cut (a clock count) the sums start at; `fresh`: the log began with this worker's
        # first clock, so nothing it pushed is missing from any later cut either.
        self.since = since
        self.fresh = fresh
        self.sums: np.ndarray | None = None      # (num_keys, row), allocated at the first fold
        self.touched: np.ndarray | None = None   # per key: pushed to since the checkpoint
        self.named: dict[str, np.ndarray] = {}   # named keys (the exactly-once audit's count)
        self.pending: list[tuple[int, Keys, np.ndarray]] = []
        self.folded_through = -1                 # the latest clock folded into the sums
        self.whole = True

    def record(self, clock: int, keys: Keys, values: np.ndarray) -> None:
        """A push of clock `clock` (kept until that clock is counted, `begin_clock`)."""
        self.pending.append((clock, keys, values))

    def begin_clock(self, clock: int) -> None:
        """Clock `clock` begins: every earlier clock was counted by the AM (folded into the sums);
        what an earlier run of this one (or a later number) recorded is dropped."""
        for entry in self.pending:
            if entry[0] < clock:
                self._fold(entry)
        self.pending = []

    def reset(self, clock: int, restored: bool = False) -> None:
        """A checkpoint's cut after `clock` clocks: what was pushed before it is in the checkpoint.
        `restored`: the model went back to that checkpoint, so everything logged is void."""
        if restored:
            self.pending = []
        else:
            self.pending = [e for e in self.pending if e[0] >= clock]
            if self.folded_through >= clock:
                self.whole = False       # a later clock's pushes are in the sums already
                return
        if self.sums is not None and self.touched is not None:
            # Zeroed in place, the rows pushed to only: a new array would be faulted in page by
            # page again (up to the model's size) after every checkpoint.
            self.sums[self.touched] = 0
            self.touched[:] = False
        self.named = {}
        self.folded_through = -1
        self.since, self.fresh, self.whole = clock, False, True

    def covers(self, since: int) -> bool:
        """Whether the sums hold every push of this worker since the cut after `since` clocks."""
        return self.whole and (self.since == since or (self.fresh and self.since >= since))

    def sums_for(self, clocks_done: int, blocks: set[int], num_blocks: int
                 ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """The sums for the keys of `blocks` once the AM has counted `clocks_done` clocks (the
        clock running when a server was lost is run again: its pushes are dropped here):
        (int keys, their summed rows, named keys' sums)."""
        self.begin_clock(clocks_done)
        named = {k: v for k, v in self.named.items() if block_of(k, num_blocks) in blocks}
        if self.sums is None or self.touched is None:
            return np.empty(0, np.int64), np.empty((0, 0), np.float32), named
        keys = np.flatnonzero(self.touched).astype(np.int64)     # (none right after a reset)
        if len(keys):
            keys = keys[np.isin(blocks_of_int_keys(keys, num_blocks), np.fromiter(blocks, np.int64))]
        return keys, self.sums[keys], named

    def _fold(self, entry: tuple[int, Keys, np.ndarray]) -> None:
        clock, keys, values = entry
        self.folded_through = max(self.folded_through, clock)
        if isinstance(keys, str):
            total = self.named.get(keys)
            self.named[keys] = values.copy() if total is None else total + values
            return
        rows = values.reshape(len(keys), -1)
        if self.sums is None or self.touched is None:
            self.sums = np.zeros((self.num_keys, rows.shape[1]), rows.dtype)
            self.touched = np.zeros(self.num_keys, bool)
        self.sums[keys] += rows        # a push names each key once (a mini-batch's sorted unique keys)
        self.touched[keys] = True


__all__ = ["PushLog"]
