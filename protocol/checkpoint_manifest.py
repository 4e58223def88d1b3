"""The records of a checkpoint directory, typed: its store blocks' `manifest-<executor>.json`
(`BlockManifest`) and the job's `job.json` (`JobCheckpoint`).

A block manifest: one per executor that wrote blocks into a checkpoint directory (psruntime/store/checkpoint.py writes and
merges them). `blocks` maps a block to its entry as stored: formats 3 and 2 `{"file",
"other_keys"}` (the file's suffix tells them apart: .buf or .npz), format 1 `[[key, file], ...]`
(still read); the entries stay in that shape because the readers
of both formats dispatch on it.

The job record: `JobCheckpoint`, the checkpoint's cut (epoch, clock, ownership table, servers)
and `JobRecord`, what it says about the job (its spec, histories, counters), each field typed.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import msgspec

from .ps_job_spec import PSJobSpec
from .ps_status import EpochResult
from .shape_history import ShapeChange, decode_history

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


class OwnershipTableRecord(msgspec.Struct, kw_only=True):
    """The block ownership table a checkpoint was cut at (psruntime.store.ownership_table's wire
    form): each block's owning server, the servers' data-plane addresses, the table's version."""

    num_blocks: int
    owners: list[str]
    addresses: dict[str, str] = {}
    version: int = 0


class JobRecord(msgspec.Struct, kw_only=True):
    """What a checkpoint records about the job besides its model (appmaster.ps.job_resume.job_record):
    its `spec`, the writing attempt, the objective and shape histories, the progress counters
    (iterations, clocks, the exactly-once audit's mini-batch count); `objective` at the cut, and
    for a cut inside an epoch the `reason` and each input block's place in it (`positions`:
    block -> (pass, row))."""

    spec: Optional[PSJobSpec] = None
    attempt_id: Optional[str] = None
    initial_objective: Optional[float] = None
    objective_history: Optional[list[EpochResult]] = None
    shape_history: list[ShapeChange] = []
    iterations: Optional[int] = None
    clocks: Optional[int] = None
    minibatches_run: Optional[int] = None
    objective: Optional[float] = None
    reason: Optional[str] = None
    positions: Optional[dict[int, tuple[int, int]]] = None


class JobCheckpoint(JobRecord, kw_only=True):
    """A PS job's checkpoint record, `job.json` in each checkpoint directory, written last (its
    presence commits the checkpoint) by appmaster/ps/checkpoints.py and read back to resume a job
    (appmaster.ps.job_resume), to recover from a lost server (appmaster.ps.recovery) and to restart
    on new executors (appmaster.ps.reconfiguration).

    The checkpoint: `epoch` (cut at its start, or inside it after the job's `clock`-th clock),
    `time` (Unix seconds), `num_blocks`, the ownership `table`, the `servers` whose blocks it
    holds and whether it holds the workers' block state; the job's own fields are `JobRecord`'s.

    Every field but `epoch` has a default and unknown fields are ignored, so job.json files of
    older versions still decode (`decode_job_checkpoint`): `objective_history` None marks one that
    predates resumable checkpoints, the counters None one that predates them (the reader keeps its
    own)."""

    epoch: int
    clock: int = 0
    time: float = 0.0
    num_blocks: int = 0
    table: Optional[OwnershipTableRecord] = None
    servers: list[str] = []
    worker_state: bool = False


def job_checkpoint(job: JobRecord, *, epoch: int, clock: int, time: float, num_blocks: int,
                   table: OwnershipTableRecord, servers: list[str], worker_state: bool) -> JobCheckpoint:
    """The checkpoint record of `job` cut at `epoch` / `clock`."""
    return JobCheckpoint(**msgspec.structs.asdict(job), epoch=epoch, clock=clock, time=time, num_blocks=num_blocks,
                         table=table, servers=servers, worker_state=worker_state)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(JobCheckpoint)


def encode_job_checkpoint(record: JobCheckpoint) -> bytes:
    return _ENCODER.encode(record)


def decode_job_checkpoint(raw: bytes) -> JobCheckpoint:
    """A job.json as its record; msgspec.DecodeError (ValidationError too) when it is not one --
    e.g. torn by a crash, which makes the checkpoint incomplete.

    A job.json of another version whose job fields do not decode as this version's types (a spec
    with a field since removed, a shape change of an unknown kind, a partial table) still loads:
    such a spec or table is None (so the job does not resume from it) and such history records
    are left out, as protocol.shape_history.decode_history does for a status."""
    try:
        record: JobCheckpoint = _DECODER.decode(raw)
        return record
    except msgspec.ValidationError:
        pass
    obj = msgspec.json.decode(raw)
    if not isinstance(obj, dict):
        raise msgspec.ValidationError(f"job.json must be an object, not {type(obj).__name__}")
    obj["shape_history"] = [msgspec.to_builtins(c) for c in decode_history(obj.get("shape_history") or [])]
    for key, kind in (("spec", PSJobSpec), ("table", OwnershipTableRecord)):
        try:
            msgspec.convert(obj.get(key), Optional[kind])
        except msgspec.ValidationError:
            obj[key] = None
    lenient: JobCheckpoint = _DECODER.decode(_ENCODER.encode(obj))   # JSON's rules: "0" is block 0
    return lenient


__all__ = ["FORMAT", "JOB_CHECKPOINT_FILE", "BlockEntry", "BlockManifest", "JobCheckpoint", "JobRecord",
           "OwnershipTableRecord", "decode_job_checkpoint", "encode_job_checkpoint", "job_checkpoint"]
