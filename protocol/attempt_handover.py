"""What a PS AM attempt leaves in the job's durable AM dir so that the next attempt can take its
executors over (work-preserving AM restart; appmaster.ps.attempt_takeover writes and reads it).

The executors themselves keep the model (servers), the input splits, worker state and each
block's place in the epoch (workers). The record holds what only the AM knew: who takes part in
what order, the ownership table, the split ledger, the epochs done and the job's histories and
counters (the `JobRecord` a checkpoint would hold). The reader trusts none of it blindly: it
checks every executor against it first.
"""
from __future__ import annotations

from typing import Literal, Optional

import msgspec

from protocol.checkpoint_manifest import JobRecord

HANDOVER_FILE = "attempt_handover.json"


class HandoverExecutor(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One executor of the job: its id, role, container, node and data-plane address; `blocks` are
    a server's model blocks or a worker's active input splits, `inactive` a worker's inactive ones
    (EPS's second dataset)."""

    executor_id: str
    role: Literal["worker", "server"]
    container_id: str
    node: str
    address: str
    blocks: list[int] = []
    inactive: list[int] = []
    partition: Optional[int] = None


class AttemptHandover(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The record (module doc): `servers` and `workers` in membership order (the workers are the
    BSP barrier's), the ownership table (`owners[b]` serves block b; `addresses`; `table_version`)
    and `epochs_done`, as the attempt `attempt_id` had them at `written_at` (Unix seconds)."""

    attempt_id: str
    written_at: float
    servers: list[HandoverExecutor]
    workers: list[HandoverExecutor]
    owners: list[str]
    addresses: dict[str, str]
    table_version: int
    epochs_done: int
    job: JobRecord


def encode_handover(record: AttemptHandover) -> bytes:
    return msgspec.json.encode(record)


def decode_handover(data: bytes) -> AttemptHandover:
    """The record from its JSON (msgspec.ValidationError / DecodeError when it is not one)."""
    return msgspec.json.decode(data, type=AttemptHandover)
