"""The PS AM's shape history: one record per finished (or failed) change of a job's executors.

Five producers in appmaster/ps write these records and the AM's `/status` serves them as
`shape_history` (also in `status.json`, each checkpoint's `job.json` and a model's metadata); the
CLI (`elastane ps scale`, `ps status`) reads them back as the same Structs. A record is one kind of
a tagged union, the tag field `mode` (the JSON key every record has always carried):

- `eps` (`EpsChange`): an EPS operation -- add / remove workers or servers, or a Cruise plan's
  step (`op` `cruise_add`, `cruise_delete`, `cruise_move`) -- appmaster.ps.eps_records.
- `kill` (`KillRestartChange`): a kill-based restart with a new shape (appmaster.ps.controller.planners.restart).
- `suspend` (`SuspendChange`): a pause or a resume on a directive's run state (appmaster.ps.controller.planners.suspension).
- `recovery` (`RecoveryChange`): every executor replaced, training back at the latest checkpoint.
- `replace_worker` (`ReplaceWorkerChange`): lost workers replaced where they stood, and
  `straggler` (`StragglerChange`): a slow worker replaced the same way (appmaster.ps.recovery).

RM directives and Cruise plans make their changes through these producers, so their outcomes
appear here as the kinds above (the directive's own outcome is `/status` `directives`, a Cruise
plan's `cruise.plan_history`).

Field names and presence are those of the JSON before these Structs existed: a key a record has
only sometimes (e.g. a failed restart has no `checkpoint`) is `UNSET` and then left out.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import msgspec
from msgspec import UNSET, UnsetType


class ExecutorCounts(msgspec.Struct, frozen=True):
    """Workers and servers, e.g. a job's shape before a change (`{"workers": 3, "servers": 2}`)."""

    workers: int
    servers: int


class EpsChange(msgspec.Struct, kw_only=True, tag_field="mode", tag="eps"):
    """One EPS operation (or Cruise plan step); `workers` / `servers`: the shape after it (None
    when it failed before one was known)."""

    changed: bool
    op: str
    requested: int
    before: ExecutorCounts
    workers: Optional[int]
    servers: Optional[int]
    time: float                             # unix time it started
    seconds: float                          # how long it took
    lost_s: float                           # how long training waited for it
    blocks_moved: int = 0
    splits_moved: int = 0
    splits_reactivated: int = 0
    epoch_switched: Optional[int] = None    # the first epoch trained with the new shape
    containers_added: list[str] = []
    containers_released: list[str] = []
    error: str = ""


class KillRestartChange(msgspec.Struct, kw_only=True, tag_field="mode", tag="kill"):
    """One kill-based restart with a new shape; it carries an EPS operation's keys too (`op`
    "kill_restart", `requested`, `after`, ...). The cut's fields are UNSET when it failed first."""

    changed: bool
    phase: str                              # RESTORED, or FAILED (the restart failed)
    before: ExecutorCounts
    workers: int
    servers: int
    time: float
    seconds: float
    lost_s: float
    steps: dict[str, float]                 # seconds by restart step
    error: str
    op: str
    requested: int
    after: ExecutorCounts
    duration_s: float
    training_time_lost_s: float
    ok: bool
    epoch: Union[int, UnsetType] = UNSET
    mid_epoch: Union[bool, UnsetType] = UNSET
    checkpoint: Union[str, UnsetType] = UNSET
    objective_before: Union[Optional[float], UnsetType] = UNSET
    objective_restored: Union[float, UnsetType] = UNSET


class SuspendChange(msgspec.Struct, kw_only=True, tag_field="mode", tag="suspend"):
    """A pause (`op` "pause": the cut's checkpoint) or a resume (`op` "resume": the shape and
    nodes it resumed with, the restored objective)."""

    op: str
    time: float
    seconds: float
    ok: bool
    epoch: int
    clock: int
    objective_before: Optional[float]
    checkpoint: Union[str, UnsetType] = UNSET
    objective_restored: Union[float, UnsetType] = UNSET
    workers: Union[int, UnsetType] = UNSET
    servers: Union[int, UnsetType] = UNSET
    nodes: Union[list[str], UnsetType] = UNSET


class RecoveryChange(msgspec.Struct, kw_only=True, tag_field="mode", tag="recovery"):
    """Training back at the latest checkpoint after executor losses: every executor replaced, or
    every server with the workers kept (`workers_kept`) when only servers were lost."""

    op: str
    time: float
    lost: list[str]                         # the losses recovered from, described
    workers: int
    servers: int
    checkpoint: str
    epoch: int                              # the checkpoint's
    epochs_redone: int
    checkpoint_time: Optional[float]
    before: ExecutorCounts
    after: ExecutorCounts
    changed: bool
    error: str
    seconds: float = 0.0
    duration_s: float = 0.0
    lost_s: float = 0.0
    objective_restored: Union[float, UnsetType] = UNSET
    workers_kept: int = 0                   # workers that stayed with their input (only servers were lost)


class ReplaceWorkerChange(msgspec.Struct, kw_only=True, tag_field="mode", tag="replace_worker"):
    """Lost workers replaced where they stood (no checkpoint); `replacements` (old -> new
    executor) and `nodes` once it succeeded."""

    op: str
    time: float
    lost: list[str]
    workers: int
    servers: int
    epoch: int
    clock: int
    clock_redone: bool
    epochs_redone: int
    before: ExecutorCounts
    after: ExecutorCounts
    changed: bool
    error: str
    seconds: float = 0.0
    duration_s: float = 0.0
    lost_s: float = 0.0
    replacements: Union[dict[str, str], UnsetType] = UNSET
    nodes: Union[list[str], UnsetType] = UNSET


class StragglerChange(ReplaceWorkerChange, kw_only=True, tag="straggler"):
    """A slow, live worker replaced the way a lost one is (`lost`: why it counted as slow)."""


class RebuildServerChange(ReplaceWorkerChange, kw_only=True, tag="rebuild_server"):
    """Lost servers rebuilt on new ones (`replacements`: lost -> new) from `checkpoint` plus the
    workers' pushes since it (`keys_replayed`); only the clock they were lost in ran again."""

    checkpoint: str = ""
    keys_replayed: int = 0


ShapeChange = Union[EpsChange, KillRestartChange, SuspendChange, RecoveryChange, ReplaceWorkerChange,
                    StragglerChange, RebuildServerChange]
"""One record of the shape history (the tagged union; `mode` says which)."""


def decode_change(obj: Any) -> ShapeChange:
    """One record from JSON builtins; `msgspec.ValidationError` names a bad field or unknown mode."""
    change: ShapeChange = msgspec.convert(obj, ShapeChange, strict=True)
    return change


def decode_history(objs: Iterable[Any]) -> list[ShapeChange]:
    """The records of a history as read back (an AM's `/status`, a checkpoint's `job.json`): one
    that does not decode (written by an older or newer AM) is left out rather than failing the
    reader."""
    out: list[ShapeChange] = []
    for obj in objs:
        try:
            out.append(decode_change(obj))
        except msgspec.ValidationError:
            continue
    return out


def history_json(changes: Iterable[ShapeChange]) -> list[dict[str, Any]]:
    """The records as JSON builtins (for writers that take plain JSON, e.g. `json.dumps`)."""
    return [msgspec.to_builtins(c) for c in changes]


__all__ = ["EpsChange", "ExecutorCounts", "KillRestartChange", "RecoveryChange", "ReplaceWorkerChange", "ShapeChange",
           "StragglerChange", "SuspendChange", "decode_change", "decode_history", "history_json"]
