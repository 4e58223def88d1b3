"""What an executor answers on its control channel, typed: one reply record per request of
protocol.executor_ops (`executor_ops.REPLY_TYPES` pairs them), and `ErrorReply` for a refusal.

A reply is the msgspec encoding of its record in the frame's JSON header (`{"op": "ok", ...}`),
arrays in the frame's buffers. Replies are read tolerantly (unknown fields ignored,
`decode_reply`), so an executor can report more than an older AM reads.
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

import msgspec

from protocol.json_types import JsonObject

NonNeg = Annotated[int, msgspec.Meta(ge=0)]
Key = Union[int, str]     # a model key (psruntime.store.ownership_table.Key)


class ControlReply(msgspec.Struct, kw_only=True):
    """Base of every success reply: unknown fields are ignored when read (an executor may report more)."""

    op: str = "ok"


class Ok(ControlReply):
    """Success, with nothing to report."""


class ErrorReply(msgspec.Struct, kw_only=True):
    """A refused or failed request: `kind` is the error's class name (`RequestError` for a bad
    request -- its message names the field --, `UserCodeError` for a user app's code, with the
    traceback), `error` its message. The same frame psruntime.wire.dataplane answers any failure with;
    its client raises it as RemoteError(kind, error)."""

    op: Literal["error"] = "error"
    kind: str
    error: str


class AppSetupReply(ControlReply):
    describe: JsonObject = {}          # psruntime.apps.base.PSApp.describe: sizes for accounting and logs


class WorkerSetupReply(ControlReply):
    rows: NonNeg = 0
    data_bytes: NonNeg = 0
    blocks: list[int] = []


class InitModelReply(ControlReply):
    keys: NonNeg = 0


class InitBlocksReply(ControlReply):
    blocks: NonNeg = 0


class SpillFigures(msgspec.Struct, kw_only=True):
    """A spilling executor's figures: a worker's disk block ratio (None on a server), the bytes of
    its spill files, its cumulative load stall seconds and block loads, and the model blocks a
    server has on disk now, and how often it spilled and reloaded them; after a step, that step's
    stall seconds."""

    alpha: Optional[float] = None
    spilled_bytes: NonNeg = 0
    stall_s: float = 0.0
    loads: NonNeg = 0
    disk_blocks: NonNeg = 0
    peak_rss_bytes: NonNeg = 0
    model_blocks_spilled: NonNeg = 0
    model_spills: NonNeg = 0
    model_reloads: NonNeg = 0
    step_stall_s: Optional[float] = None


class RunClockReply(ControlReply):
    """What a worker ran in one clock (its per-mini-batch times come as two float64 buffers), and
    where each of its input blocks is now, {block: [epoch, next_row]} (where a replacement would
    start the next clock from)."""

    epoch: NonNeg = 0
    batches: NonNeg = 0
    epoch_done: bool = True
    compute_s: float = 0.0
    comm_s: float = 0.0
    seconds: float = 0.0
    # Bytes the mini-batches pulled and pushed in all (keys and values, to any server); None: a
    # worker that does not count them.
    bytes_moved: Optional[NonNeg] = None
    spill: Optional[SpillFigures] = None
    positions: dict[str, tuple[NonNeg, NonNeg]] = {}


class RunEpochReply(RunClockReply):
    """A run_epoch's figures; with `with_objective`, the worker's objective part [value, count]."""

    objective: Optional[tuple[float, NonNeg]] = None


class ObjectiveReply(ControlReply):
    value: float
    count: NonNeg = 0


class ServerObjectiveReply(ControlReply):
    """The server part of the objective over `keys` model keys."""

    value: float
    keys: NonNeg = 0


class PositionsReply(ControlReply):
    positions: dict[str, tuple[int, int]] = {}


class SetPositionsReply(ControlReply):
    applied: NonNeg = 0


class BlockStatesReply(ControlReply):
    """Block headers (psruntime.apps.blocks.DataBlock.to_buffers) of the held blocks' state."""

    blocks: list[JsonObject] = []


class ReplayPushesReply(ControlReply):
    """The keys a worker's push log replayed (protocol.executor_ops.ReplayPushes)."""

    keys: NonNeg = 0


class BlocksReply(ControlReply):
    """The blocks (input or model) an op changed."""

    blocks: list[int] = []


class StatusReply(ControlReply):
    """An executor's status: who and where it is, its memory, blocks and table, service and
    training counters."""

    executor_id: str = ""
    pid: int = 0
    role: str = ""
    address: str = ""
    rss_bytes: NonNeg = 0
    blocks: list[int] = []
    store_bytes: NonNeg = 0
    table_version: int = -1
    incoming: list[int] = []
    requests: dict[str, int] = {}               # request parts served / queued / redirected
    data_requests: NonNeg = 0
    busy_s: Optional[float] = None
    data_bytes: NonNeg = 0
    bytes_served: Optional[float] = None
    train_counters: dict[str, float] = {}
    spill: Optional[SpillFigures] = None        # an executor of a job with spill (psruntime.spill.worker_spill)
    link_bps: Optional[float] = None
    host: str = ""                              # the machine the executor runs on (its hostname)
    host_cores: Optional[int] = None            # CPU cores the executor's process may run on


class PingReply(ControlReply):
    executor_id: str = ""


class SwitchRoleReply(ControlReply):
    role: str = ""
    previous: str = ""


class SetOwnershipReply(ControlReply):
    adopted: bool = False
    version: int = -1


class MoveBlocksReply(ControlReply):
    """The blocks the destination acknowledged (`moved`: they are its now) and, per block that did
    not move, why (`failed`): a move is per block, and the AM records the ones that went."""

    moved: list[int] = []
    failed: list[str] = []


class CancelIncomingReply(ControlReply):
    """Of the blocks a source gave up moving here: those no longer queued for (`cancelled`, or
    never incoming) and those whose data had landed after all (`owned`: the move happened)."""

    cancelled: list[int] = []
    owned: list[int] = []


class CheckpointBlocksReply(ControlReply):
    """One batch of a server's checkpoint cut `cut`: `blocks` describes the blocks whose arrays are
    the frame's buffers (psruntime.store.checkpoint.pack_blocks); `remaining`: blocks still to come."""

    cut: int
    num_blocks: NonNeg
    blocks: list[JsonObject]
    remaining: list[int] = []
    table_version: int = -1


class CheckpointReply(ControlReply):
    manifest: str = ""
    blocks: list[int] = []


class EpsJoinReply(ControlReply):
    splits: list[int] = []


class EpsSendDataReply(ControlReply):
    splits: list[int] = []
    bytes: NonNeg = 0


class EpsCommitReply(ControlReply):
    done: list[int] = []
    failed: dict[str, str] = {}
    bytes: NonNeg = 0
    active: list[int] = []
    # Splits of `done` whose inactive copy (keep_inactive) the sender could not keep, and why.
    not_kept: dict[str, str] = {}


class EpsStageReply(ControlReply):
    split: int


class EpsActivateReply(ControlReply):
    split: int
    rows: NonNeg = 0


class EpsDatasetsReply(ControlReply):
    active: list[int] = []
    inactive: list[int] = []
    staged: list[int] = []
    inactive_bytes: NonNeg = 0
    sent_bytes: NonNeg = 0
    received_bytes: NonNeg = 0
