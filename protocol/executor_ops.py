"""The PS executors' control channel: what the AM (and a peer executor) asks of an executor, typed.

Every control message is one binary data-plane frame (psruntime.frame_codec) whose JSON header is
the msgspec encoding of one of the request records below: `{"op": <tag>, ...fields}`; arrays ride
in the frame's buffers. The AM builds a record and `to_header` turns it into the header; the
executor checks an incoming header against the same record (`decode_request`), so a misspelt or
ill-typed field is refused naming it (`forbid_unknown_fields`) before any op runs.

Replies are typed too where the AM reads fields back (`RunClockReply`, `ObjectiveReply`, ...):
`decode_reply(header, RunClockReply)`. Replies are read tolerantly (unknown fields ignored), so an
executor can report more than an older AM reads.

The data ops of the elastic store (pull / push / put ...) and block migration between executors
(take_ownership, block_data, ...) keep their own compact headers (psruntime.store_requests).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, Optional, TypeVar, Union

import msgspec

NonNeg = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
RoleName = Literal["worker", "server"]


class _Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True, tag_field="op"):
    """Base of every control request: tagged by its op name."""


# -- binding an executor to the job ------------------------------------------------------------
class AppSetup(_Request, tag="app_setup"):
    """Bind the executor to the job's ML app, data spec and hyper-parameters."""

    app: str
    data: dict[str, Any] = {}
    hparams: dict[str, Any] = {}
    preset: Optional[str] = None
    # Harmony spill (protocol.ps_job_spec.PSJobSpec.spill_alpha): None = no spill.
    spill_alpha: Optional[Union[Annotated[float, msgspec.Meta(ge=0, le=1)], Literal["auto"]]] = None


class WorkerSetup(_Request, tag="worker_setup"):
    """Generate (or load) input partition `partition` of `num_partitions`."""

    partition: NonNeg
    num_partitions: Positive


class LoadSplits(_Request, tag="load_splits"):
    """Generate (or load) exactly the input blocks `blocks` (a replacement for a lost worker)."""

    blocks: list[NonNeg]


class InitModel(_Request, tag="init_model"):
    """Put every model key's initial value (one worker does it for the job)."""


class InitBlocks(_Request, tag="init_blocks"):
    """Initialise the worker's blocks' local state and push what that yields."""


# -- training ------------------------------------------------------------------------------------
class RunClock(_Request, tag="run_clock"):
    """One clock: the worker's next `batches` mini-batches of `epoch`, flushed at the end;
    `count_key`: also push +1 per mini-batch to that key (the exactly-once audit)."""

    epoch: NonNeg
    batches: Positive
    num_workers: Positive
    count_key: Optional[str] = None


class RunEpoch(_Request, tag="run_epoch"):
    """The rest of `epoch` in one op; `with_objective`: the worker's objective part too."""

    epoch: NonNeg
    num_workers: Positive
    with_objective: bool = False
    count_key: Optional[str] = None


class Objective(_Request, tag="objective"):
    """This worker's part of the objective under the current model."""


class ServerObjective(_Request, tag="server_objective"):
    """The app's server part of the objective over the keys this executor owns."""


class Positions(_Request, tag="positions"):
    """Every held input block's place in its epoch pass."""


class SetPositions(_Request, tag="set_positions"):
    """Put held blocks back at {block: [epoch, next_row]} (a restarted job continues its epoch)."""

    positions: dict[str, tuple[NonNeg, NonNeg]]


class BlockStates(_Request, tag="block_states"):
    """The worker-local state of every input block held here (NMF's user factors, LDA's topic
    assignments, each block's place in its epoch), for a checkpoint: one block header each in the
    reply, their arrays in its buffers."""


class SetBlockStates(_Request, tag="set_block_states"):
    """Put the held blocks' state back from a checkpoint (headers here, arrays in the buffers)."""

    blocks: list[dict[str, Any]]


class StopTraining(_Request, tag="stop_training"):
    """Abandon a running clock at the next mini-batch."""


# -- the executor itself ---------------------------------------------------------------------------
class Status(_Request, tag="status"):
    """pid, role, RSS, blocks, table version, service and training counters."""


class Shutdown(_Request, tag="shutdown"):
    """Reply, then stop the process cleanly."""


class SwitchRole(_Request, tag="switch_role"):
    """Worker <-> server in place (a server must hold no model blocks first)."""

    role: RoleName


class SetOwnership(_Request, tag="set_ownership"):
    """Adopt this ownership table if it is newer (psruntime.ownership_table wire form)."""

    table: dict[str, Any]


class MoveBlocks(_Request, tag="move_blocks"):
    """Run the two-step migration of `blocks` to `dst` as their source."""

    blocks: list[NonNeg]
    dst: str
    dst_address: str


# -- checkpoints -----------------------------------------------------------------------------------
class CheckpointBlocks(_Request, tag="checkpoint_blocks"):
    """Snapshot the owned `blocks` (all when None) in one step and return them in batches of at
    most `max_bytes`; with `cut`, the next batch of that snapshot."""

    blocks: Optional[list[NonNeg]] = None
    max_bytes: Optional[Positive] = None
    cut: Optional[int] = None


class RestoreBlocksData(_Request, tag="restore_blocks_data"):
    """Install the blocks in the frame's buffers (descriptors here), all or nothing."""

    blocks: list[dict[str, Any]]


# -- EPS: worker-to-worker input splits -----------------------------------------------------------
class EpsJoin(_Request, tag="eps_join"):
    """A new worker joins with no splits; it receives them from the current workers."""


class EpsSendData(_Request, tag="eps_send_data"):
    """Stage `splits`' input data at the worker `dst_address` (alongside training)."""

    splits: list[NonNeg]
    dst_address: str


class SplitHandover(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One split of an `eps_commit`: where it goes and where the receiver finds its data."""

    split: NonNeg
    dst_address: str
    source: Literal["staged", "inactive", "message"]


class EpsCommit(_Request, tag="eps_commit"):
    """At a clock boundary: hand the splits (their state) over; keep inactive copies or not."""

    transfers: list[SplitHandover]
    keep_inactive: bool = False


class EpsDiscardStaged(_Request, tag="eps_discard_staged"):
    """Drop data staged for abandoned transfers."""

    splits: list[NonNeg]


ControlRequest = Union[AppSetup, WorkerSetup, LoadSplits, InitModel, InitBlocks, RunClock, RunEpoch, Objective,
                       ServerObjective, Positions, SetPositions, BlockStates, SetBlockStates, StopTraining, Status,
                       Shutdown, SwitchRole, SetOwnership, MoveBlocks, CheckpointBlocks, RestoreBlocksData, EpsJoin, EpsSendData,
                       EpsCommit, EpsDiscardStaged]

REQUEST_OPS: frozenset[str] = frozenset(t.__struct_config__.tag for t in ControlRequest.__args__)  # type: ignore[attr-defined]


# -- replies the AM reads ---------------------------------------------------------------------------
class ControlReply(msgspec.Struct, kw_only=True):
    """Base of typed replies: unknown fields are ignored (an executor may report more)."""

    op: str = "ok"


class WorkerSetupReply(ControlReply):
    rows: NonNeg = 0
    data_bytes: NonNeg = 0
    blocks: list[int] = []


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
    positions: dict[str, tuple[NonNeg, NonNeg]] = {}


class ObjectiveReply(ControlReply):
    value: float
    count: NonNeg = 0


class PositionsReply(ControlReply):
    positions: dict[str, tuple[int, int]] = {}


class BlockStatesReply(ControlReply):
    """Block headers (psruntime.apps.blocks.DataBlock.to_buffers) of the held blocks' state."""

    blocks: list[dict[str, Any]] = []


class SpillFigures(msgspec.Struct, kw_only=True):
    """A spilling executor's figures: a worker's disk block ratio (None on a server), the bytes of
    its spill files, its cumulative load stall seconds and block loads, and the model blocks a
    server has on disk now, and how often it spilled and reloaded them."""

    alpha: Optional[float] = None
    spilled_bytes: NonNeg = 0
    stall_s: float = 0.0
    loads: NonNeg = 0
    disk_blocks: NonNeg = 0
    peak_rss_bytes: NonNeg = 0
    model_blocks_spilled: NonNeg = 0
    model_spills: NonNeg = 0
    model_reloads: NonNeg = 0


class StatusReply(ControlReply):
    """The fields of an executor's status the AM uses (it reports more; see psruntime.executor)."""

    executor_id: str = ""
    pid: int = 0
    role: str = ""
    rss_bytes: NonNeg = 0
    blocks: list[int] = []
    store_bytes: NonNeg = 0
    data_requests: NonNeg = 0
    busy_s: Optional[float] = None
    bytes_served: Optional[float] = None
    link_bps: Optional[float] = None
    host: str = ""                              # the machine the executor runs on (its hostname)
    host_cores: Optional[int] = None            # CPU cores the executor's process may run on
    train_counters: dict[str, float] = {}
    spill: Optional[SpillFigures] = None        # an executor of a job with spill (psruntime.worker_spill)


class CheckpointBlocksReply(ControlReply):
    """One batch of a server's checkpoint cut `cut`: `blocks` describes the blocks whose arrays are
    the frame's buffers (psruntime.checkpoint.pack_blocks); `remaining`: blocks still to come."""

    cut: int
    num_blocks: NonNeg
    blocks: list[dict[str, Any]]
    remaining: list[int] = []
    table_version: int = -1


class EpsSendDataReply(ControlReply):
    splits: list[int] = []
    bytes: NonNeg = 0


class EpsCommitReply(ControlReply):
    done: list[int] = []
    failed: dict[str, str] = {}
    bytes: NonNeg = 0
    active: list[int] = []


class ControlMessageError(ValueError):
    """A control header that does not match its op's record; the message names the field."""


R = TypeVar("R", bound=ControlReply)


def to_header(request: ControlRequest) -> dict[str, Any]:
    """The frame header for `request` ({"op": tag, ...fields}, defaults left out)."""
    out: dict[str, Any] = msgspec.to_builtins(request)
    return out


def decode_request(header: Mapping[str, Any]) -> ControlRequest:
    """The typed request a control header carries; ControlMessageError naming the bad field."""
    try:
        request: ControlRequest = msgspec.convert(dict(header), ControlRequest)
    except msgspec.ValidationError as e:
        raise ControlMessageError(f"{header.get('op')!r}: {e}") from None
    return request


def decode_reply(header: Mapping[str, Any], kind: type[R]) -> R:
    """A reply header read as `kind`; ControlMessageError naming the bad field."""
    try:
        return msgspec.convert(dict(header), kind, strict=False)
    except msgspec.ValidationError as e:
        raise ControlMessageError(f"reply to {kind.__name__.removesuffix('Reply')}: {e}") from None
