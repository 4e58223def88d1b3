"""What an EPS elastic operation did, for its caller, the AM's status and the CLI."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

from protocol.ps_status import EpsOpStatus, EpsTransfer, OpShape
from protocol.shape_history import EpsChange, ExecutorCounts
from protocol.errors import StateError


class ElasticOpError(StateError, RuntimeError):
    """An elastic change that cannot be made or failed; `http_status` is what the AM's HTTP API
    answers (400: an impossible change, 409: not now -- another change runs, or no training)."""

    http_status = 400


class ElasticBusy(ElasticOpError):
    """Another change is running, or the job is not training: try again later."""

    http_status = 409


class ElasticOpFailed(ElasticOpError):
    """A change that started and failed part-way (an executor or a transfer failed); what was
    done is in its record, and the job trains on with the shape the record reports."""

    http_status = 500


@dataclass
class ElasticOpRecord:
    """One EPS operation (add_workers, add_servers, remove_workers, remove_servers)."""

    op: str
    requested: int
    started: float                                  # unix time
    epoch_started: int                              # epochs done when it started
    workers_before: int
    servers_before: int
    workers_after: Optional[int] = None
    servers_after: Optional[int] = None
    epoch_switched: Optional[int] = None            # the first epoch trained with the new shape
    duration_s: float = 0.0
    containers_added: list[str] = field(default_factory=list)
    containers_released: list[str] = field(default_factory=list)
    executors_added: list[str] = field(default_factory=list)
    executors_removed: list[str] = field(default_factory=list)
    blocks_moved: int = 0                           # model blocks migrated server-to-server
    splits_moved: int = 0                           # input splits sent worker-to-worker
    splits_reactivated: int = 0                     # input splits taken back from inactive copies
    bytes_sent: int = 0                             # worker-to-worker input data and state
    transfers: list[EpsTransfer] = field(default_factory=list)
    training_time_lost_s: float = 0.0               # time training waited for the change
    # Where the time went, seconds by step: allocate (ask -> last container granted), start
    # (granted -> last executor announced), register (bind + address broadcast), move_blocks,
    # stage_splits, boundary (waiting for the clock boundary and switching there).
    phases: dict[str, float] = field(default_factory=dict)
    error: str = ""

    def add_phase(self, name: str, seconds: float) -> None:
        self.phases[name] = round(self.phases.get(name, 0.0) + max(0.0, seconds), 4)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the time the `with` block took to phase `name` (a block that raises adds none)."""
        t = time.monotonic()
        yield
        self.add_phase(name, time.monotonic() - t)

    @property
    def ok(self) -> bool:
        return not self.error

    def to_history(self) -> EpsChange:
        """The entry of the AM's `shape_history` (protocol.shape_history)."""
        return EpsChange(changed=self.ok, op=self.op, requested=self.requested,
                         before=ExecutorCounts(self.workers_before, self.servers_before),
                         workers=self.workers_after, servers=self.servers_after, time=self.started,
                         seconds=round(self.duration_s, 4), lost_s=round(self.training_time_lost_s, 4),
                         blocks_moved=self.blocks_moved, splits_moved=self.splits_moved,
                         splits_reactivated=self.splits_reactivated, epoch_switched=self.epoch_switched,
                         containers_added=list(self.containers_added),
                         containers_released=list(self.containers_released), error=self.error)

    def status(self) -> EpsOpStatus:
        """The operation as the AM's status (`eps`) and POST /scale's answer show it."""
        return EpsOpStatus(op=self.op, requested=self.requested, started=self.started,
                           epoch_started=self.epoch_started, epoch_switched=self.epoch_switched,
                           before=OpShape(workers=self.workers_before, servers=self.servers_before),
                           after=OpShape(workers=self.workers_after, servers=self.servers_after),
                           duration_s=round(self.duration_s, 4), containers_added=list(self.containers_added),
                           containers_released=list(self.containers_released),
                           executors_added=list(self.executors_added), executors_removed=list(self.executors_removed),
                           blocks_moved=self.blocks_moved, splits_moved=self.splits_moved,
                           splits_reactivated=self.splits_reactivated, bytes_sent=self.bytes_sent,
                           transfers=list(self.transfers), training_time_lost_s=round(self.training_time_lost_s, 4),
                           phases=dict(self.phases), ok=self.ok, error=self.error)
