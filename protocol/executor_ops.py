"""The PS executors' control channel: every request an executor serves, typed, and the reply to each.

Every control message is one binary data-plane frame (psruntime.wire.frame_codec) whose JSON header is
the msgspec encoding of one of the request records below: `{"op": <tag>, ...fields}`; arrays ride
in the frame's buffers. The AM (and a peer executor: migration, EPS split transfers) builds a record
and `to_header` turns it into the header; the executor decodes an incoming header once into its
record (by the op's tag, `forbid_unknown_fields`), so a misspelt or ill-typed field is refused with
an `ErrorReply` naming it before any op runs, and dispatches the record by its type to a handler
`(request, arrays) -> (reply record, arrays)`. No handler sees the header.

Each request has one reply record (protocol.executor_replies, paired in `REPLY_TYPES`); the reader
decodes it once where it arrives (`decode_reply`, tolerant of fields it does not know). A refusal is
an `ErrorReply` {kind, error}, which the data-plane client raises as RemoteError(kind, error).

The one message the other way, an executor announcing itself to the AM once it serves, is the
request `ExecutorReady` too (answered `Ok`), decoded once by the AM's executor pool.

The data ops of the elastic store (get / put / update: pull and push) keep their compact headers
(psruntime.store.store_requests): they are the hot path, carry their keys in buffers, and are decoded
once into a typed DataRequest there.
"""
from __future__ import annotations

from typing import Annotated, Literal, Mapping, Optional, TypeVar, Union

import msgspec

from protocol.executor_replies import (AppSetupReply, BlocksReply, BlockStatesReply, CancelIncomingReply,
                                       CheckpointBlocksReply,
                                       CheckpointReply, ControlReply, EpsActivateReply, EpsCommitReply,
                                       EpsDatasetsReply, EpsJoinReply, EpsSendDataReply, EpsStageReply, ErrorReply,
                                       InitBlocksReply, InitModelReply, Key, MoveBlocksReply, ObjectiveReply, Ok,
                                       PingReply, PositionsReply, ReplayPushesReply, RunClockReply, RunEpochReply,
                                       ServerObjectiveReply,
                                       SetOwnershipReply, SetPositionsReply, SpillFigures, StatusReply,
                                       SwitchRoleReply, WorkerSetupReply)
from protocol.errors import ProtocolError
from protocol.json_types import JsonObject, JsonValue

__all__ = ["AppSetup", "AppSetupReply", "BlockData", "BlockStates", "BlockStatesReply", "BlocksReply",
           "CancelIncoming", "CancelIncomingReply", "Checkpoint", "CheckpointBlocks", "CheckpointBlocksReply", "CheckpointReply",
           "ControlMessageError", "ControlReply", "ControlRequest", "EpsActivate", "EpsActivateReply", "EpsCommit",
           "EpsCommitReply", "EpsDatasets", "EpsDatasetsReply", "EpsDiscardStaged", "EpsJoin", "EpsJoinReply",
           "EndClock", "EpsSendData", "EpsSendDataReply", "EpsStage", "EpsStageReply", "ErrorReply", "ExecutorReady",
           "ExecutorRequest", "InitBlocks", "InitBlocksReply", "InitModel", "InitModelReply", "LoadSplits",
           "MoveBlocks", "MoveBlocksReply", "NonNeg", "Objective", "ObjectiveReply", "Ok", "Ping", "PingReply",
           "Positions", "PositionsReply", "Positive", "REPLY_TYPES", "REQUEST_OPS", "REQUEST_TYPES", "Restore",
           "ReleaseServers", "ReplayPushes", "ReplayPushesReply", "ResetPushLog", "RestoreBlocksData", "RoleName", "RunClock", "RunClockReply", "RunEpoch", "RunEpochReply",
           "ServerObjective", "ServerObjectiveReply", "SetBlockStates", "SetOwnership", "SetOwnershipReply",
           "SetPositions", "SetPositionsReply", "Shutdown", "SpillFigures", "SplitHandover", "SplitSource", "Status",
           "StatusReply", "StopTraining", "SwitchRole", "SwitchRoleReply", "TakeOwnership", "WorkerSetup",
           "WorkerSetupReply", "decode_as", "decode_reply", "decode_request", "encode_reply", "to_header"]

NonNeg = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
RoleName = Literal["worker", "server"]


class ExecutorRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True, tag_field="op"):
    """Base of every control request: tagged by its op name."""


# -- binding an executor to the job ------------------------------------------------------------
class AppSetup(ExecutorRequest, tag="app_setup"):
    """Bind the executor to the job's ML app, data spec and hyper-parameters."""

    app: str
    data: JsonObject = {}          # the app's data spec (its Spec Struct decodes it, psruntime.apps)
    hparams: JsonObject = {}       # the app's hyper-parameters (its HParams Struct decodes them)
    preset: Optional[str] = None
    # Harmony spill (protocol.ps_job_spec.PSJobSpec.spill_alpha): None = no spill.
    spill_alpha: Optional[Union[Annotated[float, msgspec.Meta(ge=0, le=1)], Literal["auto"]]] = None
    # Threads a COMP uses (PSJobSpec.comp_threads); 0 = the container's vcores (CONTAINER_VCORES).
    comp_threads: NonNeg = 0
    # Mini-batches per sync window (PSJobSpec.sync_batches; psruntime.write_back_cache).
    sync_batches: Positive = 1


class WorkerSetup(ExecutorRequest, tag="worker_setup"):
    """Generate (or load) input partition `partition` of `num_partitions`."""

    partition: NonNeg
    num_partitions: Positive


class LoadSplits(ExecutorRequest, tag="load_splits"):
    """Generate (or load) exactly the input blocks `blocks` (a replacement for a lost worker)."""

    blocks: list[NonNeg]


class InitModel(ExecutorRequest, tag="init_model"):
    """Put every model key's initial value (one worker does it for the job)."""


class InitBlocks(ExecutorRequest, tag="init_blocks"):
    """Initialise the worker's blocks' local state and push what that yields."""


# -- training ------------------------------------------------------------------------------------
class RunClock(ExecutorRequest, tag="run_clock"):
    """One clock: the worker's next `batches` mini-batches of `epoch`, flushed at the end;
    `count_key`: also push +1 per mini-batch to that key (the exactly-once audit)."""

    epoch: NonNeg
    batches: Positive
    num_workers: Positive
    count_key: Optional[str] = None
    # The AM's count of clocks done as this one begins (BSP): the worker's push log keeps the
    # clock's pushes under it (psruntime.push_log); -1: none kept.
    clock: int = -1


class RunEpoch(ExecutorRequest, tag="run_epoch"):
    """The rest of `epoch` in one op; `with_objective`: the worker's objective part too."""

    epoch: NonNeg
    num_workers: Positive
    with_objective: bool = False
    count_key: Optional[str] = None


class Objective(ExecutorRequest, tag="objective"):
    """This worker's part of the objective under the current model."""


class ServerObjective(ExecutorRequest, tag="server_objective"):
    """The app's server part of the objective over the keys this executor owns."""


class Positions(ExecutorRequest, tag="positions"):
    """Every held input block's place in its epoch pass; `settled`: once no clock runs (a new AM
    attempt taking the executors over waits out the clock its predecessor started)."""

    settled: bool = False


class SetPositions(ExecutorRequest, tag="set_positions"):
    """Put held blocks back at {block: [epoch, next_row]} (a restarted job continues its epoch)."""

    positions: dict[str, tuple[NonNeg, NonNeg]]


class BlockStates(ExecutorRequest, tag="block_states"):
    """The worker-local state of every input block held here (NMF's user factors, LDA's topic
    assignments, each block's place in its epoch), for a checkpoint: one block header each in the
    reply, their arrays in its buffers."""


class SetBlockStates(ExecutorRequest, tag="set_block_states"):
    """Put the held blocks' state back from a checkpoint (headers here, arrays in the buffers)."""

    blocks: list[JsonObject]


class StopTraining(ExecutorRequest, tag="stop_training"):
    """Abandon a running clock at the next mini-batch."""


class ReleaseServers(ExecutorRequest, tag="release_servers"):
    """Servers of the job are being replaced under this worker (docs/internals.md "AM recovery"):
    requests in flight to them fail now (a server on a vanished host would hold a pull until the
    keepalive gave up), the running step ends, and the worker's store client starts afresh -- no
    push pending and no error of the old servers carried into the next clock. `servers`: their
    data-plane addresses; empty: every server of the worker's ownership table (all of them are
    replaced). Answered once no training step runs."""

    servers: list[str] = []


class ResetPushLog(ExecutorRequest, tag="reset_push_log"):
    """A checkpoint's cut after `clock` clocks: the worker's push log starts again from it;
    `restored`: the model went back to that checkpoint (all it logged is void)."""

    clock: NonNeg
    restored: bool = False


class ReplayPushes(ExecutorRequest, tag="replay_pushes"):
    """Rebuild lost servers' `blocks` (restored from the latest checkpoint, now owned by their new
    servers): push this worker's sums since that checkpoint for their keys, over the `clocks_done`
    clocks the AM counted, and wait until they are applied. Refused when the worker's log is not
    whole (psruntime.push_log)."""

    blocks: list[NonNeg]
    clocks_done: NonNeg
    since: NonNeg                  # the checkpoint's cut (its clock count) the blocks were restored from


class EndClock(ExecutorRequest, tag="end_clock"):
    """End the running clock after the mini-batch in progress, flushed as at its planned end (a
    reshaping step waits for the clock boundary); its reply counts the mini-batches that ran. With
    no clock running it is a no-op (the clock it meant has ended)."""


# -- the executor itself ---------------------------------------------------------------------------
class Status(ExecutorRequest, tag="status"):
    """pid, role, RSS, blocks, table version, service and training counters."""


class Shutdown(ExecutorRequest, tag="shutdown"):
    """Reply, then stop the process cleanly."""


class SwitchRole(ExecutorRequest, tag="switch_role"):
    """Worker <-> server in place (a server must hold no model blocks first)."""

    role: RoleName


class SetOwnership(ExecutorRequest, tag="set_ownership"):
    """Adopt this ownership table if it is newer (psruntime.store.ownership_table wire form)."""

    table: JsonObject              # OwnershipTable.to_wire; OwnershipTable.from_wire checks it


class MoveBlocks(ExecutorRequest, tag="move_blocks"):
    """Run the two-step migration of `blocks` to `dst` as their source."""

    blocks: list[NonNeg]
    dst: str
    dst_address: str


class Ping(ExecutorRequest, tag="ping"):
    """Who are you (the executor's id)."""


class TakeOwnership(ExecutorRequest, tag="take_ownership"):
    """Migration, source -> destination: start queueing requests for `blocks`, coming from `src`."""

    blocks: list[NonNeg]
    src: str


class BlockData(ExecutorRequest, tag="block_data"):
    """Migration, source -> destination: a block's data (psruntime.store.store_service.block_data_message:
    the non-dense `keys` with one buffer each, then the dense keys and values as two buffers) and
    the push ids it was applied with at the source."""

    block: NonNeg
    keys: list[Key]
    src: str = ""
    applied: list[int] = []


class CancelIncoming(ExecutorRequest, tag="cancel_incoming"):
    """Migration, source -> destination: an abandoned handover; stop queueing for `blocks`. The
    reply says which are not incoming any more and which had landed from `src` after all."""

    blocks: list[NonNeg]
    src: str = ""


# -- checkpoints -----------------------------------------------------------------------------------
class CheckpointBlocks(ExecutorRequest, tag="checkpoint_blocks"):
    """Snapshot the owned `blocks` (all when None) in one step and return them in batches of at
    most `max_bytes`; with `cut`, the next batch of that snapshot; with `cut` and `release`, let
    that snapshot go (the AM abandoned the checkpoint) and return nothing."""

    blocks: Optional[list[NonNeg]] = None
    max_bytes: Optional[Positive] = None
    cut: Optional[int] = None
    release: bool = False


class RestoreBlocksData(ExecutorRequest, tag="restore_blocks_data"):
    """Install the blocks in the frame's buffers (descriptors here), all or nothing."""

    blocks: list[JsonObject]


class Checkpoint(ExecutorRequest, tag="checkpoint"):
    """Write the owned `blocks` (all when None) into the local dir `dir` (.npz per block + manifest)."""

    dir: Annotated[str, msgspec.Meta(min_length=1)]
    blocks: Optional[list[NonNeg]] = None


class Restore(ExecutorRequest, tag="restore"):
    """Load `blocks` (which the table gives this executor) from the local dir `dir`."""

    dir: Annotated[str, msgspec.Meta(min_length=1)]
    blocks: list[NonNeg]


# -- EPS: worker-to-worker input splits -----------------------------------------------------------
class EpsJoin(ExecutorRequest, tag="eps_join"):
    """A new worker joins with no splits; it receives them from the current workers."""


class EpsSendData(ExecutorRequest, tag="eps_send_data"):
    """Stage `splits`' input data at the worker `dst_address` (alongside training)."""

    splits: list[NonNeg]
    dst_address: str


SplitSource = Literal["staged", "inactive", "message"]   # where an EPS receiver finds a split's data


class SplitHandover(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One split of an `eps_commit`: where it goes and where the receiver finds its data."""

    split: NonNeg
    dst_address: str
    source: SplitSource


class EpsCommit(ExecutorRequest, tag="eps_commit"):
    """At a clock boundary: hand the splits (their state) over; keep inactive copies or not."""

    transfers: list[SplitHandover]
    keep_inactive: bool = False


class EpsDiscardStaged(ExecutorRequest, tag="eps_discard_staged"):
    """Drop data staged for abandoned transfers."""

    splits: list[NonNeg]


class EpsStage(ExecutorRequest, tag="eps_stage"):
    """Sender -> destination: keep this split's input data (a DataBlock header, arrays in the
    buffers) staged in memory."""

    split: NonNeg
    block: JsonObject


class EpsActivate(ExecutorRequest, tag="eps_activate"):
    """Sender -> destination: build the split from its data (in this message, staged, or its own
    inactive copy) and the state in `block` (a DataBlock header, arrays in the buffers); train on it
    from the next clock on."""

    split: NonNeg
    block: JsonObject
    source: SplitSource


class EpsDatasets(ExecutorRequest, tag="eps_datasets"):
    """Active, inactive and staged splits of this worker."""


# -- the executor to the AM --------------------------------------------------------------------------
class ExecutorReady(ExecutorRequest, tag="executor_ready"):
    """Executor -> AM, once it serves: its id, its data-plane address (host:port), pid and role.
    The AM's pool (appmaster.ps.runtime.executor_pool.ExecutorPool.handle_frame) decodes it once and answers
    `Ok`. The one request that travels this way, so no executor serves it (not in ControlRequest)."""

    executor_id: Annotated[str, msgspec.Meta(min_length=1)]
    address: Annotated[str, msgspec.Meta(pattern=r"^.+:[0-9]+$")]
    pid: Optional[NonNeg] = None
    role: Optional[RoleName] = None


ControlRequest = Union[AppSetup, WorkerSetup, LoadSplits, InitModel, InitBlocks, RunClock, RunEpoch, Objective,
                       ServerObjective, Positions, SetPositions, BlockStates, SetBlockStates, StopTraining, EndClock,
                       ReleaseServers, ResetPushLog, ReplayPushes, Status,
                       Shutdown, SwitchRole, SetOwnership, MoveBlocks, CheckpointBlocks, RestoreBlocksData, EpsJoin, EpsSendData,
                       EpsCommit, EpsDiscardStaged, Ping, TakeOwnership, BlockData, CancelIncoming, Checkpoint,
                       Restore, EpsStage, EpsActivate, EpsDatasets]

REQUEST_TYPES: dict[str, type[ExecutorRequest]] = {
    t.__struct_config__.tag: t for t in ControlRequest.__args__}  # type: ignore[attr-defined]
REQUEST_OPS: frozenset[str] = frozenset(REQUEST_TYPES)

# The reply record of each request.
REPLY_TYPES: dict[type[ExecutorRequest], type[ControlReply]] = {
    AppSetup: AppSetupReply, WorkerSetup: WorkerSetupReply, LoadSplits: WorkerSetupReply, InitModel: InitModelReply,
    InitBlocks: InitBlocksReply, RunClock: RunClockReply, RunEpoch: RunEpochReply, Objective: ObjectiveReply,
    ServerObjective: ServerObjectiveReply, Positions: PositionsReply, SetPositions: SetPositionsReply,
    BlockStates: BlockStatesReply, SetBlockStates: BlocksReply, StopTraining: Ok, EndClock: Ok, ReleaseServers: Ok,
    ResetPushLog: Ok, ReplayPushes: ReplayPushesReply,
    Status: StatusReply,
    Shutdown: Ok, SwitchRole: SwitchRoleReply, SetOwnership: SetOwnershipReply, MoveBlocks: MoveBlocksReply,
    CheckpointBlocks: CheckpointBlocksReply, RestoreBlocksData: BlocksReply, EpsJoin: EpsJoinReply,
    EpsSendData: EpsSendDataReply, EpsCommit: EpsCommitReply, EpsDiscardStaged: Ok, Ping: PingReply,
    TakeOwnership: Ok, BlockData: Ok, CancelIncoming: CancelIncomingReply, Checkpoint: CheckpointReply, Restore: BlocksReply,
    EpsStage: EpsStageReply, EpsActivate: EpsActivateReply, EpsDatasets: EpsDatasetsReply,
    ExecutorReady: Ok,     # executor -> AM
}


class ControlMessageError(ProtocolError, ValueError):
    """A control header that does not match its op's record; the message names the field."""


R = TypeVar("R", bound=ControlReply)
Q = TypeVar("Q", bound=ExecutorRequest)


def to_header(request: ExecutorRequest) -> JsonObject:
    """The frame header for `request` ({"op": tag, ...fields}, defaults left out)."""
    out: JsonObject = msgspec.to_builtins(request)
    return out


def decode_request(header: Mapping[str, JsonValue]) -> ControlRequest:
    """The typed request a control header carries; ControlMessageError naming the bad field."""
    try:
        request: ControlRequest = msgspec.convert(dict(header), ControlRequest)
    except msgspec.ValidationError as e:
        raise ControlMessageError(f"{header.get('op')!r}: {e}") from None
    return request


def decode_as(header: Mapping[str, JsonValue], kind: type[Q]) -> Q:
    """`header` (its data-plane "id" left out) decoded as the request `kind`; ControlMessageError
    naming the op and the bad field."""
    try:
        return msgspec.convert({k: v for k, v in header.items() if k != "id"}, kind)
    except msgspec.ValidationError as e:
        raise ControlMessageError(f"{header.get('op')!r}: {e}") from None


def encode_reply(reply: ControlReply | ErrorReply) -> JsonObject:
    """The frame header of a reply record."""
    out: JsonObject = msgspec.to_builtins(reply)
    return out


def decode_reply(header: Mapping[str, JsonValue], kind: type[R]) -> R:
    """A reply header read as `kind`; ControlMessageError naming the bad field."""
    try:
        return msgspec.convert(dict(header), kind, strict=False)
    except msgspec.ValidationError as e:
        raise ControlMessageError(f"reply to {kind.__name__.removesuffix('Reply')}: {e}") from None
