"""EPS's two datasets (§3.1.4) as the AM keeps track of them: per worker, the input splits in its
*active* dataset (in memory, trained on) and in its *inactive* dataset (on its local disk only).

When a worker is added, the splits sent to it stay on their senders as inactive copies; when a
worker is removed later, a split whose inactive copy a remaining worker still has is re-activated
there instead of being sent again (`eps_decisions.drain` makes that choice from this ledger).

Validity rule of an inactive copy: a split's *input data* never changes, so an inactive copy's
data is always valid; its *worker-local state* (NMF's user factors, LDA's topic assignments)
does change while the split trains elsewhere, so a re-activation always takes the state from the
split's current (active) holder: only the state travels, never the data. For apps without local
state (MLR, Lasso) nothing travels at all.

Pure bookkeeping, no I/O; the executors hold the splits themselves (psruntime.eps.eps_worker_ops).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .eps_decisions import Transfer
from protocol.errors import StateError


class LedgerError(StateError, ValueError):
    """A change that does not match what the ledger knows (unknown worker, split not held ...)."""


@dataclass
class SplitLedger:
    """Active and inactive input splits of every worker of the job."""

    active: dict[str, set[int]] = field(default_factory=dict)
    inactive: dict[str, set[int]] = field(default_factory=dict)

    def add_worker(self, worker: str, splits: Iterable[int] = ()) -> None:
        if worker in self.active:
            raise LedgerError(f"worker {worker} is already in the ledger")
        splits = set(splits)
        held = sorted(s for s in splits if self.holder_of(s) is not None)
        if held:
            raise LedgerError(f"splits {held} are already active on other workers")
        self.active[worker] = splits
        self.inactive[worker] = set()

    def remove_worker(self, worker: str) -> None:
        """Forget a worker (its local disk, with its inactive dataset, goes with its container)."""
        self._need(worker)
        if self.active[worker]:
            raise LedgerError(f"worker {worker} still has active splits {sorted(self.active[worker])}")
        del self.active[worker]
        del self.inactive[worker]

    def replace_worker(self, lost: str, replacement: str) -> list[int]:
        """`replacement` takes over the active splits of `lost`, which leaves the ledger (its
        inactive copies went with its container); returns the splits taken over."""
        self._need(lost)
        if replacement in self.active:
            raise LedgerError(f"worker {replacement} is already in the ledger")
        splits = self.active.pop(lost)
        del self.inactive[lost]
        self.active[replacement] = splits
        self.inactive[replacement] = set()
        return sorted(splits)

    def _need(self, worker: str) -> None:
        if worker not in self.active:
            raise LedgerError(f"unknown worker {worker}")

    def holder_of(self, split: int) -> str | None:
        for w, s in self.active.items():
            if split in s:
                return w
        return None

    def check(self, transfers: Sequence[Transfer]) -> None:
        """Raise LedgerError unless every transfer can be applied (in order), changing nothing."""
        shadow = SplitLedger({w: set(s) for w, s in self.active.items()},
                             {w: set(s) for w, s in self.inactive.items()})
        for t in transfers:
            shadow.apply(t, keep_inactive=False)

    def apply(self, t: Transfer, keep_inactive: bool) -> None:
        """Record a done transfer. `keep_inactive`: the sender keeps its copy (a worker being added
        receives it; a leaving worker's copy goes with it)."""
        self._need(t.src)
        self._need(t.dst)
        if t.item not in self.active[t.src]:
            raise LedgerError(f"split {t.item} is not active on {t.src}")
        if t.reactivate and t.item not in self.inactive[t.dst]:
            raise LedgerError(f"split {t.item} is not in the inactive dataset of {t.dst}")
        self.active[t.src].discard(t.item)
        self.active[t.dst].add(t.item)
        self.inactive[t.dst].discard(t.item)   # active now: its copy on disk is the active one's source
        if keep_inactive:
            self.inactive[t.src].add(t.item)

    def active_of(self, worker: str) -> list[int]:
        self._need(worker)
        return sorted(self.active[worker])

    def inactive_of(self, worker: str) -> list[int]:
        self._need(worker)
        return sorted(self.inactive[worker])

    def holdings(self) -> dict[str, list[int]]:
        return {w: sorted(s) for w, s in self.active.items()}

    def inactive_holdings(self) -> dict[str, list[int]]:
        return {w: sorted(s) for w, s in self.inactive.items()}

    def to_json(self) -> dict[str, Any]:
        return {w: {"active": sorted(self.active[w]), "inactive": sorted(self.inactive[w])} for w in self.active}
