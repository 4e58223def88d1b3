"""The records of a checkpoint directory, typed: its store blocks' `manifest-<executor>.json`
(`BlockManifest`) and the job's `job.json` (`JobCheckpoint`).

A block manifest: one per executor that wrote blocks into a checkpoint directory (psruntime/store/checkpoint.py writes and
merges them). `blocks` maps a block to its entry as stored: formats 3 and 2 `{"file",
"other_keys"}` (the file's suffix tells them apart: .buf or .npz), format 1 `[[key, file], ...]`
(still read); the entries stay in that shape because the readers
of both formats dispatch on it.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import msgspec

FORMAT = 3

# A block's entry: {"file", "other_keys"} (formats 3 and 2) or [[key, file], ...] (format 1).
BlockEntry = Union[dict[str, Any], list[list[Any]]]


class BlockManifest(msgspec.Struct, forbid_unknown_fields=False):
    """One executor's blocks in a checkpoint directory: the job's block count, the ownership
    table version the blocks were cut at, and each block's entry (keys are block numbers, JSON
    strings on disk)."""

    num_blocks: int
    blocks: dict[int, BlockEntry] = {}
    format: int = FORMAT
    table_version: int = 0


JOB_CHECKPOINT_FILE = "job.json"


class JobCheckpoint(msgspec.Struct, forbid_unknown_fields=False):
    """A PS job's checkpoint record, `job.json` in each checkpoint directory, written last (its
    presence commits the checkpoint) by appmaster/ps/checkpoints.py and read back to resume a job
    (appmaster.ps.job_resume), to recover from a lost server (appmaster.ps.recovery) and to restart
    on new executors (appmaster.ps.reconfiguration).

    The checkpoint: `epoch` (cut at its start, or inside it after the job's `clock`-th clock),
    `time` (Unix seconds), `num_blocks`, the ownership `table` (OwnershipTable.to_wire), the
    `servers` whose blocks it holds and whether it holds the workers' block state. The job (from
    appmaster.ps.job_resume.job_record): its `spec`, the writing attempt, the objective and shape
    histories and the progress counters; `objective` at the cut, and for a cut inside an epoch the
    `reason` and each input block's place in it (`positions`: block -> [pass, row]).

    Unknown fields are ignored and every field but `epoch` has a default, so job.json files of
    older versions still decode: `objective_history` None marks one that predates resumable
    checkpoints, the counters None one that predates them (the reader keeps its own)."""

    epoch: int
    clock: int = 0
    time: float = 0.0
    num_blocks: int = 0
    table: Optional[dict[str, Any]] = None
    servers: list[str] = []
    worker_state: bool = False
    spec: Optional[dict[str, Any]] = None
    attempt_id: Optional[str] = None
    initial_objective: Optional[float] = None
    objective_history: Optional[list[dict[str, Any]]] = None
    shape_history: list[dict[str, Any]] = []
    iterations: Optional[int] = None
    clocks: Optional[int] = None
    minibatches_run: Optional[int] = None
    objective: Optional[float] = None
    reason: Optional[str] = None
    positions: Optional[dict[str, list[int]]] = None


def encode_job_checkpoint(record: JobCheckpoint) -> bytes:
    return msgspec.json.encode(record)


def decode_job_checkpoint(raw: bytes) -> JobCheckpoint:
    """A job.json as its record; msgspec.DecodeError (ValidationError too) when it is not one --
    e.g. torn by a crash, which makes the checkpoint incomplete."""
    return msgspec.json.decode(raw, type=JobCheckpoint)
