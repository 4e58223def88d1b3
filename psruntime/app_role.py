"""The ML side of an executor: the control ops with which the PS AM drives training.

An executor serves the elastic store either way; these ops add the app on top (registered on the
executor's op table by request type, see `Executor.register_ops`; each handler takes its
record of protocol.executor_ops and returns its reply record):

    app_setup {app, preset, data, hparams}   bind the ML app (servers need it for their objective part)
    worker_setup {partition, num_partitions} generate this worker's input partition
    load_splits {blocks}                     generate exactly these input blocks (a worker that
                                             replaces a lost one takes over its splits)
    init_model {}                            put every model key's initial value (one worker does it)
    init_blocks {}                           initialise the blocks' local state, push what it yields
    run_clock {epoch, batches, num_workers, count_key?}
                                             one clock (BSP iteration): the next `batches` mini-batches
                                             of the epoch, PULL -> COMP -> PUSH each, flushed at the end;
                                             with count_key, also push +1 to that key per mini-batch
                                             (an audit: the servers count the mini-batches applied).
                                             Reply: counts and sums, `epoch_done` (every block held
                                             here has had its pass of the epoch), `positions` (each
                                             held block's [epoch, next_row] now), `bytes_moved`
                                             (what its pulls and pushes carried), and the
                                             per-mini-batch compute / communication times as
                                             float64 buffers (no JSON for arrays)
    run_epoch {epoch, num_workers, with_objective?, count_key?}
                                             the rest of the epoch in one op (all of it if no clock of
                                             it ran); with_objective, the worker's objective part too
    positions {} / set_positions {positions}  every held block's position in its epoch pass
    objective {}                             this worker's objective part under the current model
    server_objective {}                      the app's server part over the keys this executor owns
    stop_training {}                         abandon a running epoch at the next mini-batch
    end_clock {}                             end the running clock after its mini-batch in progress
                                             (flushed; the reply counts what ran)

A training step (run_clock, run_epoch) runs as a task of its own, not as the request's: the
request awaits it through asyncio.shield, so a dropped connection (the data plane cancels a lost
connection's ops; an AM that died mid-clock) loses only the reply. The step goes on to its end, or
to the cut that the next AM attempt's EndClock sets (appmaster.ps.attempt_takeover): its
mini-batches' pushes are sent and its blocks' positions moved past them. Cancelled mid-COMP
instead, a step would leave a worker's state changed in place (LDA's topic assignments) by a
mini-batch whose push never went out, and the servers' model and the workers' state inconsistent
for good. Only the executor's own shutdown (`AppRole.end_steps`) cancels a step.

With `spill_alpha` in app_setup a worker keeps a fraction alpha of its input blocks on local disk
as lz4 frames, reloaded ahead of use (psruntime.spill.worker_spill); its step replies then carry a
`spill` object (alpha, bytes spilled, load stall seconds).

Clocks are paced by the AM (BSP: it waits for every worker before the next clock; SSP: it keeps
each worker within the staleness bound, in clocks), so the objective it gathers between epochs is
exact under BSP. A worker keeps its place in the epoch across clocks in each block's state
(`[epoch, next_row]`, training_pipeline.POSITION): the place travels with a block that EPS moves to
another worker between two clocks, so an epoch is still every input block trained exactly once,
whoever holds it when. The mini-batches themselves run in psruntime.training_pipeline.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Awaitable, Coroutine, Mapping, TypedDict

import msgspec
import numpy as np

from psruntime.apps.base import AppConfigError, AppOutputError, KeyValues, Partition, PSApp, StepContext
from psruntime.apps.blocks import BlockFormatError, DataBlock
from psruntime.apps.random_streams import partition_block_range
from psruntime.apps.registry import UserCodeError, create_app, is_user_app, raised_in_user_code
from protocol import container_env, executor_ops as ctl
from psruntime.control_ops import Answer, Arrays, Handler, OpTable, Outcome, bind, table
from psruntime.push_log import PushLog
from psruntime.wire.dataplane import RequestError
from psruntime.spill.model_spill import ModelSpillMonitor
from psruntime.store.store_client import StoreClient, StoreClientError
from psruntime.training_pipeline import (PushRecorder, StepTimes, SubtaskRunner, TrainingPipeline, TrainingStopped,
                                         block_position,
                                         epoch_position, init_blocks, init_model, set_epoch_position)
from psruntime.spill.worker_spill import WorkerSpill, parse_mode
from protocol.json_types import JsonObject

log = logging.getLogger(__name__)

# What the runtime raises on purpose in an app op: never blamed on a user app's code, even when a
# user's exception led to it (a RequestError for a user Spec's AppConfigError). Any other exception
# is the user's only if it was raised in the user's code (`_user_error`).
_RUNTIME_ERRORS = (RequestError, UserCodeError, StoreClientError, ConnectionError, TrainingStopped, BlockFormatError)
# How long a stopping executor lets a running training step end on its own before cancelling it
# (AppRole.end_steps): well within the NM's SIGTERM -> SIGKILL grace (container_manager.KILL_GRACE_S).
STEP_STOP_GRACE_S = 0.2

if TYPE_CHECKING:  # the executor imports this module, not the other way round at run time
    from psruntime.executor import Executor


class AppRole:
    """The app-level state of one executor: the app, and for a worker its partition and store client."""

    def __init__(self, executor: "Executor", runner: SubtaskRunner | None = None) -> None:
        self.executor = executor
        self.app: PSApp | None = None
        self.app_name = ""                 # as the job names it ("mlr", or a user's "module:Class")
        self.blocks: list[DataBlock] = []
        self.store: StoreClient | None = None
        self.stop = asyncio.Event()
        self.cut = asyncio.Event()    # the AM's EndClock: the running clock ends after its mini-batch
        self._busy = asyncio.Lock()   # one training step at a time on this executor
        self._steps: set[asyncio.Task[Answer]] = set()   # running training steps (`_detached`)
        self.pipeline = TrainingPipeline(runner)
        self.spill: WorkerSpill | None = None      # with the job's spill_alpha (psruntime.spill.worker_spill)
        self.model_spill: ModelSpillMonitor | None = None   # ... and a server's model blocks (psruntime.spill.model_spill)
        self.push_log: PushLog | None = None   # a worker's pushes since the checkpoint (psruntime.push_log)

    def ops(self) -> OpTable:
        return {kind: self._reporting_user_errors(op) for kind, op in self._ops().items()}

    def _reporting_user_errors(self, op: Handler) -> Handler:
        """`op`, answering an exception that a user app's code raised as UserCodeError with its
        traceback (the AM fails the job with it: the executor is alive, the code is wrong). The
        runtime's own errors -- a bad request, a lost peer, a stopped step -- pass as they are."""
        def call(request: ctl.ExecutorRequest, arrays: Arrays) -> Outcome:
            try:
                result = op(request, arrays)
            except Exception as e:  # noqa: BLE001 - re-raised, or wrapped with its traceback
                raise self._user_error(e) from e
            if not inspect.isawaitable(result):
                return result
            return self._awaiting(result)
        return call

    async def _awaiting(self, result: Awaitable[Answer]) -> Answer:
        try:
            return await result
        except Exception as e:  # noqa: BLE001 - re-raised, or wrapped with its traceback
            raise self._user_error(e) from e

    def _user_error(self, e: Exception) -> Exception:
        """`e` as UserCodeError if a user app's code raised it -- its traceback passes through the
        app's package (registry.raised_in_user_code: compute, keys_for_batch, init_block,
        objective ... called by the runtime) -- or it is the runtime's check of what that code
        returned (AppOutputError); else `e` itself: the runtime's own failures in a user app's op
        (a full spill disk, an arbiter's refusal, a stale ownership table) are not the user's."""
        if self.app is None or not is_user_app(self.app_name) or isinstance(e, _RUNTIME_ERRORS):
            return e
        if isinstance(e, AppOutputError) or raised_in_user_code(self.app_name, e):
            return UserCodeError(f"app {self.app_name} on {self.executor.executor_id}", e)
        return e

    def _ops(self) -> OpTable:
        return table(bind(ctl.AppSetup, self.app_setup), bind(ctl.WorkerSetup, self.worker_setup),
                     bind(ctl.LoadSplits, self.load_splits), bind(ctl.InitModel, self.init_model),
                     bind(ctl.InitBlocks, self.init_blocks), bind(ctl.RunEpoch, self.run_epoch),
                     bind(ctl.RunClock, self.run_clock), bind(ctl.Positions, self.positions),
                     bind(ctl.SetPositions, self.set_positions), bind(ctl.Objective, self.objective),
                     bind(ctl.ServerObjective, self.server_objective), bind(ctl.StopTraining, self.stop_training),
                     bind(ctl.EndClock, self.end_clock), bind(ctl.ReleaseServers, self.release_servers),
                     bind(ctl.ResetPushLog, self.reset_push_log), bind(ctl.ReplayPushes, self.replay_pushes),
                     bind(ctl.BlockStates, self.block_states), bind(ctl.SetBlockStates, self.set_block_states))

    @property
    def counters(self) -> dict[str, int]:
        """Cumulative training figures (the AM's Cruise driver differences them per epoch)."""
        return self.pipeline.counters

    def data_bytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)

    def close(self) -> None:
        for t in self._steps:      # `end_steps` first; a step still here has nothing left to wait for
            t.cancel()
        self.pipeline.close()
        if self.spill is not None:
            self.spill.close()
        if self.model_spill is not None:
            self.model_spill.stop()

    @property
    def step_lock(self) -> asyncio.Lock:
        """Held while a training step (a clock or an epoch) runs: whoever changes `blocks` takes it first."""
        return self._busy

    # -- setup -------------------------------------------------------------------------------
    def app_setup(self, req: ctl.AppSetup, arrays: Arrays) -> Answer:
        name = req.app
        try:
            self.app = create_app(name, req.data, req.hparams, preset=req.preset)
        except AppConfigError as e:
            raise RequestError(str(e)) from None
        except UserCodeError as e:   # the user's import or constructor: its traceback goes to the AM
            raise UserCodeError(f"{e.what} on {self.executor.executor_id}", e.__cause__ or e) from None
        self.app_name = name
        self.pipeline.set_comp_threads(comp_threads(req.comp_threads, type(self.app), os.environ))
        self.pipeline.sync_batches = req.sync_batches
        try:
            mode = parse_mode(req.spill_alpha)
        except ValueError as e:
            raise RequestError(str(e)) from None
        if mode is not None and self.spill is None:
            self.spill = WorkerSpill(mode)
            self.pipeline.residency = self.spill.reloader
            self.model_spill = ModelSpillMonitor(self.executor.service, self.spill.reloader.store,
                                                 self.spill.limit_bytes, self.spill.rss)
            self.model_spill.start()
        return ctl.AppSetupReply(describe=self.app.describe()), ()

    def _need_app(self) -> PSApp:
        if self.app is None:
            raise RequestError("no app set up on this executor (send app_setup first)")
        return self.app

    def _need_store(self) -> StoreClient:
        if self.store is None:
            raise RequestError("this executor has no partition (send worker_setup first)")
        # Adopt whatever newer ownership the executor has learned from the AM's broadcasts.
        self.store.set_table(self.executor.service.table)
        return self.store

    def worker_setup(self, req: ctl.WorkerSetup, arrays: Arrays) -> Answer:
        app = self._need_app()
        n, i = req.num_partitions, req.partition
        if i >= n:
            raise RequestError(f"partition {i} is out of range for {n} partitions")
        if self.spill is not None:
            part = Partition(i, n, self.spill.load_blocks(app, partition_block_range(app.num_blocks, i, n)))
        else:
            part = app.generate_partition(i, n)
        self.blocks = part.blocks
        if self.store is None:
            self.store = StoreClient(self.executor.service.table, self.executor.client)
        return ctl.WorkerSetupReply(rows=part.num_rows, data_bytes=part.nbytes,
                                    blocks=[b.block_index for b in part.blocks]), ()

    async def load_splits(self, req: ctl.LoadSplits, arrays: Arrays) -> Answer:
        """Generate (or read) exactly the given input blocks, in split order, as this worker's
        active splits; their positions start at (0, 0) until `set_positions`."""
        app = self._need_app()
        wanted = req.blocks
        if not all(b < app.num_blocks for b in wanted):
            raise RequestError(f"field 'blocks' must be a list of input blocks below {app.num_blocks}")
        async with self._busy:
            if self.spill is not None:
                self.blocks = self.spill.load_blocks(app, sorted(set(wanted)))
            else:
                self.blocks = [app.input_block(b) for b in sorted(set(wanted))]
            app.release_generation_caches()
        if self.store is None:
            self.store = StoreClient(self.executor.service.table, self.executor.client)
        return ctl.WorkerSetupReply(rows=sum(b.num_rows for b in self.blocks), data_bytes=self.data_bytes(),
                                    blocks=[b.block_index for b in self.blocks]), ()

    async def init_model(self, req: ctl.InitModel, arrays: Arrays) -> Answer:
        app, store = self._need_app(), self._need_store()
        await init_model(store, app)
        return ctl.InitModelReply(keys=app.num_keys), ()

    async def init_blocks(self, req: ctl.InitBlocks, arrays: Arrays) -> Answer:
        app, store = self._need_app(), self._need_store()
        if self.spill is not None:
            await self.spill.init_blocks(store, app, self.blocks)
        else:
            await init_blocks(store, app, self.blocks)
        return ctl.InitBlocksReply(blocks=len(self.blocks)), ()

    # -- training ----------------------------------------------------------------------------
    def _detached(self, step: Coroutine[Any, Any, Answer]) -> Awaitable[Answer]:
        """Run the training step `step` as a task of its own and await it through asyncio.shield:
        cancelling the request (its connection dropped) loses only the reply, never a step cut
        mid-mini-batch (see the module doc). `end_steps` cancels the task itself."""
        task = asyncio.ensure_future(step)
        self._steps.add(task)
        task.add_done_callback(self._step_ended)
        return asyncio.shield(task)

    def _step_ended(self, task: "asyncio.Task[Answer]") -> None:
        self._steps.discard(task)
        if task.cancelled():
            return
        e = task.exception()       # retrieved here too: a step whose requester went away has no one to tell
        if e is not None:
            log.debug("training step on %s ended with %s: %s", self.executor.executor_id, type(e).__name__, e)

    async def end_steps(self, grace_s: float = STEP_STOP_GRACE_S) -> None:
        """The executor is stopping: the running training step (if any) is told to stop (its next
        mini-batch does not start) and, unless it has ended within `grace_s`, cancelled -- never
        waited out to the end of a long COMP or a pull from a silent server (a SIGTERM stops the
        executor well within the NM's grace before SIGKILL; a COMP in the compute thread is left
        to finish there, unawaited)."""
        self.stop.set()
        self.cut.set()
        steps = list(self._steps)
        if not steps:
            return
        _, running = await asyncio.wait(steps, timeout=grace_s)
        for t in running:
            t.cancel()
        await asyncio.gather(*steps, return_exceptions=True)

    def run_clock(self, req: ctl.RunClock, arrays: Arrays) -> Awaitable[Answer]:
        """One clock: the next `batches` mini-batches of the epoch, flushed (see the module doc);
        run detached from the request (`_detached`)."""
        # An EndClock read before this clock's request meant an earlier clock: forgotten here, as
        # the request is dispatched (not when its task first runs: an EndClock read right after
        # this request, in the same read, is for this clock).
        self.cut.clear()
        return self._detached(self._run_clock(req))

    async def _run_clock(self, req: ctl.RunClock) -> Answer:
        app, store = self._need_app(), self._need_store()
        ctx = StepContext(epoch=req.epoch, num_workers=req.num_workers,
                          threads=self.pipeline.comp_threads)
        if self._busy.locked():
            raise RequestError("a clock is already running on this executor")
        async with self._busy:
            t_start = time.perf_counter()
            self.pipeline.push_record = self._push_recorder(app, req.clock)
            times = await self._run_batches(app, store, ctx, req.count_key, req.batches, self.cut)
            done = all(epoch_position(b, req.epoch) >= b.num_rows for b in self.blocks)
            reply = ctl.RunClockReply(**_step_figures(req.epoch, done, times, t_start))
            reply.spill = self._after_step(reply.seconds)
            reply.positions = {str(b.block_index): block_position(b) for b in self.blocks}
        return reply, _step_arrays(times)

    def _push_recorder(self, app: PSApp, clock: int) -> PushRecorder | None:
        """What records this clock's pushes in the push log (none for a step without a clock number)."""
        if clock < 0:
            return None
        if self.push_log is None:
            self.push_log = PushLog(app.num_keys, since=clock)     # fresh: nothing pushed before
        log = self.push_log
        log.begin_clock(clock)
        return lambda keys, values: log.record(clock, keys, values)

    def run_epoch(self, req: ctl.RunEpoch, arrays: Arrays) -> Awaitable[Answer]:
        """The rest of the epoch (all of it, unless clocks of it ran already) in one op, run
        detached from the request like a clock (`_detached`; StopTraining ends it)."""
        return self._detached(self._run_epoch(req))

    async def _run_epoch(self, req: ctl.RunEpoch) -> Answer:
        app, store = self._need_app(), self._need_store()
        ctx = StepContext(epoch=req.epoch, num_workers=req.num_workers,
                          threads=self.pipeline.comp_threads)
        if self._busy.locked():
            raise RequestError("an epoch is already running on this executor")
        async with self._busy:
            t_start = time.perf_counter()
            self.pipeline.push_record = None
            times = await self._run_batches(app, store, ctx, req.count_key, None)
            reply = ctl.RunEpochReply(**_step_figures(req.epoch, True, times, t_start))
            reply.spill = self._after_step(reply.seconds)
            if req.with_objective:
                part = await self.pipeline.objective(app, store, self.blocks)
                reply.objective = (part.value, part.count)
        return reply, _step_arrays(times)

    def _after_step(self, seconds: float) -> ctl.SpillFigures | None:
        """With spill: the step's stall time and alpha for the reply, alpha tuned for the next step."""
        if self.spill is None:
            return None
        return msgspec.convert(self.spill.after_step(self.blocks, seconds), ctl.SpillFigures)

    def materialize(self, block: DataBlock) -> None:
        """Bring a spilled block's data back into memory for good (before it leaves this worker)."""
        if self.spill is not None:
            self.spill.reloader.materialize(block)

    def spill_figures(self) -> ctl.SpillFigures | None:
        """alpha, bytes spilled, stall seconds ... of this worker, or a server's bytes and model
        blocks spilled (None without spill)."""
        if self.spill is None:
            return None
        figures: dict[str, float | None] = self.spill.figures() if self.blocks else {"alpha": None}
        if self.model_spill is not None:
            figures.update(self.model_spill.figures())
        figures["spilled_bytes"] = self.spill.reloader.store.nbytes()    # input and model files
        return msgspec.convert(figures, ctl.SpillFigures)

    async def _run_batches(self, app: PSApp, store: StoreClient, ctx: StepContext, count_key: str | None,
                           limit: int | None, cut: asyncio.Event | None = None) -> StepTimes:
        """The pipeline's mini-batches of this step, from each block's position (see the module doc)."""
        self.stop.clear()
        try:
            return await self.pipeline.run_batches(app, store, self.blocks, ctx, limit, count_key, self.stop, cut)
        except TrainingStopped as e:
            raise RequestError(str(e)) from None

    async def block_states(self, req: ctl.BlockStates, arrays: Arrays) -> Answer:
        """The worker-local state of every held block, for a checkpoint: one block header each
        (DataBlock.to_buffers of the block without its input data), the arrays in the buffers."""
        headers: list[JsonObject] = []
        out: list[np.ndarray] = []
        async with self._busy:         # at a clock boundary: no training step changes the state
            for b in self.blocks:
                h, bufs = DataBlock(b.app, b.block_index, b.row_start, b.num_rows, {}, b.state).to_buffers()
                headers.append(h)
                out.extend(np.ascontiguousarray(x) for x in bufs)
        return ctl.BlockStatesReply(blocks=headers), out

    async def set_block_states(self, req: ctl.SetBlockStates, arrays: Arrays) -> Answer:
        """Put held blocks' state back from a checkpoint (all of them or none)."""
        headers = req.blocks
        held = {b.block_index: b for b in self.blocks}
        states: list[tuple[DataBlock, dict[str, np.ndarray]]] = []
        at = 0
        for h in headers:
            descs = h.get("arrays")
            n = len(descs) if isinstance(descs, list) else 0
            try:
                incoming = DataBlock.from_buffers(h, arrays[at:at + n])
            except BlockFormatError as e:
                raise RequestError(f"bad block state: {e}") from None
            at += n
            block = held.get(incoming.block_index)
            if block is None or block.num_rows != incoming.num_rows:
                raise RequestError(f"block {incoming.block_index} is not held here (or has other rows)")
            states.append((block, incoming.state))
        async with self._busy:
            for block, state in states:
                block.state = state
        return ctl.BlocksReply(blocks=[b.block_index for b, _ in states]), ()

    async def positions(self, req: ctl.Positions, arrays: Arrays) -> Answer:
        """Each block's position in the epoch: {block: [epoch, next_row]} (for a restart); with
        `settled`, after the running clock (if any) has ended."""
        if req.settled:
            async with self._busy:
                pass
        return ctl.PositionsReply(positions={str(b.block_index): block_position(b) for b in self.blocks}), ()

    async def set_positions(self, req: ctl.SetPositions, arrays: Arrays) -> Answer:
        """Set the positions of the blocks held here that appear in {block: [epoch, next_row]}
        (a restarted job continues the epoch where the old one stopped)."""
        parsed: dict[int, tuple[int, int]] = {}
        for k, v in req.positions.items():
            if not k.isdigit():
                raise RequestError(f"bad position {k!r}: {list(v)!r} (want \"<block>\": [epoch, next_row])")
            parsed[int(k)] = v
        async with self._busy:
            applied = 0
            for b in self.blocks:
                if b.block_index in parsed:
                    e, row = parsed[b.block_index]
                    set_epoch_position(b, e, min(row, b.num_rows))
                    applied += 1
        return ctl.SetPositionsReply(applied=applied), ()

    async def objective(self, req: ctl.Objective, arrays: Arrays) -> Answer:
        app, store = self._need_app(), self._need_store()
        part = await self.pipeline.objective(app, store, self.blocks)
        return ctl.ObjectiveReply(value=part.value, count=part.count), ()

    def server_objective(self, req: ctl.ServerObjective, arrays: Arrays) -> Answer:
        app = self._need_app()
        store = self.executor.service.store
        # Block by block (the server part is additive over keys): concatenating and sorting every
        # owned block first would copy the whole model twice at the server's memory peak.
        value, count = 0.0, 0
        for b in self.executor.service.owned_blocks():
            data = store.export_arrays(b)      # dense model rows; other keys (the audit counter) left out
            if data.values is not None and len(data.keys):
                value += float(app.server_objective(KeyValues(data.keys, data.values)))
                count += len(data.keys)
        return ctl.ServerObjectiveReply(value=value, keys=count), ()

    def stop_training(self, req: ctl.StopTraining, arrays: Arrays) -> Answer:
        self.stop.set()
        return ctl.Ok(), ()

    async def release_servers(self, req: ctl.ReleaseServers, arrays: Arrays) -> Answer:
        """Let go of servers of the job before they are replaced (protocol.executor_ops)."""
        self.stop.set()
        table = self.executor.service.table
        addresses = req.servers or sorted({a for o in set(table.owners) if (a := table.addresses.get(o))})
        for address in addresses:
            self.executor.client.mark_lost(address, f"server at {address} replaced by the AM")
        async with self._busy:           # the running step has ended (failed, or stopped)
            if self.store is not None:
                self.store = StoreClient(table, self.executor.client)
        return ctl.Ok(), ()

    def reset_push_log(self, req: ctl.ResetPushLog, arrays: Arrays) -> Answer:
        if self.push_log is not None:
            self.push_log.reset(req.clock, req.restored)
        return ctl.Ok(), ()

    async def replay_pushes(self, req: ctl.ReplayPushes, arrays: Arrays) -> Answer:
        """This worker's part of rebuilding lost servers' blocks (protocol.executor_ops)."""
        log = self.push_log
        async with self._busy:
            if log is None:
                return ctl.ReplayPushesReply(keys=0), ()      # it has pushed nothing
            if not log.covers(req.since):
                raise RequestError(f"the push log does not hold every push since the checkpoint after "
                                   f"clock {req.since} (it starts at {log.since}, whole: {log.whole})")
            store = self._need_store()
            keys, rows, named = log.sums_for(req.clocks_done, set(req.blocks), store.table.num_blocks)
            if len(keys):
                await store.update_array(keys, rows, "add")
            for name, value in named.items():
                await store.update([name], "add", [value])
        return ctl.ReplayPushesReply(keys=len(keys) + len(named)), ()

    def end_clock(self, req: ctl.EndClock, arrays: Arrays) -> Answer:
        """The running clock ends after its mini-batch in progress (answered at once)."""
        self.cut.set()
        return ctl.Ok(), ()


def comp_threads(asked: int | None, app: type[PSApp[msgspec.Struct, msgspec.Struct]], env: Mapping[str, str]) -> int:
    """A COMP's threads: the job's `comp_threads`, else the cores the container was given, capped
    by what the app can use (`PSApp.DEFAULT_COMP_THREADS`)."""
    if asked:
        return asked
    vcores = _container_vcores(env)
    return min(vcores, app.DEFAULT_COMP_THREADS) if app.DEFAULT_COMP_THREADS else vcores


def _container_vcores(env: Mapping[str, str]) -> int:
    """The vcores the executor's container was given (its launch environment), at least 1."""
    try:
        return max(1, int(env.get(container_env.CONTAINER_VCORES, "1")))
    except ValueError:
        return 1


class StepFigures(TypedDict):
    """A run_clock / run_epoch reply's counts and sums (fields of RunClockReply / RunEpochReply)."""

    epoch: int
    batches: int
    epoch_done: bool
    compute_s: float
    comm_s: float
    seconds: float
    bytes_moved: int


def _step_figures(epoch: int, done: bool, times: StepTimes, t_start: float) -> StepFigures:
    """A run_clock / run_epoch reply's counts and sums."""
    return {"epoch": epoch, "batches": times.batches, "epoch_done": done, "compute_s": float(sum(times.compute)),
            "comm_s": float(sum(times.comm)), "seconds": time.perf_counter() - t_start, "bytes_moved": times.bytes}


def _step_arrays(times: StepTimes) -> list[np.ndarray]:
    """The per-mini-batch compute and communication times, then the parts of each spent waiting for
    an arbiter's grant: a step reply's four float64 buffers."""
    return [np.asarray(times.compute, np.float64), np.asarray(times.comm, np.float64),
            np.asarray(times.compute_wait, np.float64), np.asarray(times.comm_wait, np.float64)]
