"""The ML side of an executor: the control ops with which the PS AM drives training.

An executor serves the elastic store either way; these ops add the app on top (registered on the
executor's op table, see `Executor.extra_ops`):

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
                                             held block's [epoch, next_row] now), and the
                                             per-mini-batch compute / communication times as two
                                             float64 buffers (no JSON for arrays)
    run_epoch {epoch, num_workers, with_objective?, count_key?}
                                             the rest of the epoch in one op (all of it if no clock of
                                             it ran); with_objective, the worker's objective part too
    positions {} / set_positions {positions}  every held block's position in its epoch pass
    objective {}                             this worker's objective part under the current model
    server_objective {}                      the app's server part over the keys this executor owns
    stop_training {}                         abandon a running epoch at the next mini-batch

With `spill_alpha` in app_setup a worker keeps a fraction alpha of its input blocks on local disk
as lz4 frames, reloaded ahead of use (psruntime.worker_spill); its step replies then carry a
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
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import numpy as np

from psruntime.apps.base import AppConfigError, KeyValues, Partition, PSApp, StepContext
from psruntime.apps.blocks import BlockFormatError, DataBlock
from psruntime.apps.random_streams import partition_block_range
from psruntime.apps.registry import UserCodeError, create_app, is_user_app
from psruntime.dataplane import Reply, RequestError
from psruntime.frame_codec import Frame
from psruntime.model_spill import ModelSpillMonitor
from psruntime.request_fields import int_field
from psruntime.store_client import StoreClient, StoreClientError
from psruntime.training_pipeline import (StepTimes, SubtaskRunner, TrainingPipeline, TrainingStopped, block_position,
                                         epoch_position, init_blocks, init_model, set_epoch_position)
from psruntime.worker_spill import WorkerSpill, parse_mode

# What the runtime raises on its own in an app op: never blamed on a user app's code.
_RUNTIME_ERRORS = (RequestError, UserCodeError, StoreClientError, ConnectionError, TrainingStopped, BlockFormatError)

if TYPE_CHECKING:  # the executor imports this module, not the other way round at run time
    from psruntime.executor import Executor

Op = Callable[[Frame], "Reply | Awaitable[Reply]"]


class AppRole:
    """The app-level state of one executor: the app, and for a worker its partition and store client."""

    def __init__(self, executor: "Executor", runner: SubtaskRunner | None = None) -> None:
        self.executor = executor
        self.app: PSApp | None = None
        self.app_name = ""                 # as the job names it ("mlr", or a user's "module:Class")
        self.blocks: list[DataBlock] = []
        self.store: StoreClient | None = None
        self.stop = asyncio.Event()
        self._busy = asyncio.Lock()   # one training step at a time on this executor
        self.pipeline = TrainingPipeline(runner)
        self.spill: WorkerSpill | None = None      # with the job's spill_alpha (psruntime.worker_spill)
        self.model_spill: ModelSpillMonitor | None = None   # ... and a server's model blocks (psruntime.model_spill)

    def ops(self) -> dict[str, Op]:
        return {name: self._reporting_user_errors(op) for name, op in self._ops().items()}

    def _reporting_user_errors(self, op: Op) -> Op:
        """`op`, answering an exception that a user app's code raised as UserCodeError with its
        traceback (the AM fails the job with it: the executor is alive, the code is wrong). The
        runtime's own errors -- a bad request, a lost peer, a stopped step -- pass as they are."""
        def call(frame: Frame) -> "Reply | Awaitable[Reply]":
            try:
                result = op(frame)
            except Exception as e:  # noqa: BLE001 - re-raised, or wrapped with its traceback
                raise self._user_error(e) from e
            if not inspect.isawaitable(result):
                return result
            return self._awaiting(result)
        return call

    async def _awaiting(self, result: Awaitable[Reply]) -> Reply:
        try:
            return await result
        except Exception as e:  # noqa: BLE001 - re-raised, or wrapped with its traceback
            raise self._user_error(e) from e

    def _user_error(self, e: Exception) -> Exception:
        if self.app is None or not is_user_app(self.app_name) or isinstance(e, _RUNTIME_ERRORS):
            return e
        return UserCodeError(f"app {self.app_name} on {self.executor.executor_id}", e)

    def _ops(self) -> dict[str, Op]:
        return {"app_setup": self.app_setup, "worker_setup": self.worker_setup, "load_splits": self.load_splits,
                "init_model": self.init_model,
                "init_blocks": self.init_blocks, "run_epoch": self.run_epoch, "run_clock": self.run_clock,
                "positions": self.positions, "set_positions": self.set_positions, "objective": self.objective,
                "server_objective": self.server_objective, "stop_training": self.stop_training,
                "block_states": self.block_states, "set_block_states": self.set_block_states}

    @property
    def counters(self) -> dict[str, int]:
        """Cumulative training figures (the AM's Cruise driver differences them per epoch)."""
        return self.pipeline.counters

    def data_bytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)

    def close(self) -> None:
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
    def app_setup(self, frame: Frame) -> Reply:
        h = frame.header
        name = h.get("app")
        if not isinstance(name, str):
            raise RequestError("field 'app' must be an app name")
        for f in ("data", "hparams"):
            if not isinstance(h.get(f, {}), dict):
                raise RequestError(f"field {f!r} must be an object")
        try:
            self.app = create_app(name, h.get("data") or {}, h.get("hparams") or {}, preset=h.get("preset"))
        except AppConfigError as e:
            raise RequestError(str(e)) from None
        except UserCodeError as e:   # the user's import or constructor: its traceback goes to the AM
            raise UserCodeError(f"{e.what} on {self.executor.executor_id}", e.__cause__ or e) from None
        self.app_name = name
        try:
            mode = parse_mode(h.get("spill_alpha"))
        except ValueError as e:
            raise RequestError(str(e)) from None
        if mode is not None and self.spill is None:
            self.spill = WorkerSpill(mode)
            self.pipeline.residency = self.spill.reloader
            self.model_spill = ModelSpillMonitor(self.executor.service, self.spill.reloader.store,
                                                 self.spill.limit_bytes, self.spill.rss)
            self.model_spill.start()
        return {"op": "ok", "describe": self.app.describe()}, ()

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

    def worker_setup(self, frame: Frame) -> Reply:
        app = self._need_app()
        n = int_field(frame.header, "num_partitions", 1)
        i = int_field(frame.header, "partition", 0)
        if i >= n:
            raise RequestError(f"partition {i} is out of range for {n} partitions")
        if self.spill is not None:
            part = Partition(i, n, self.spill.load_blocks(app, partition_block_range(app.num_blocks, i, n)))
        else:
            part = app.generate_partition(i, n)
        self.blocks = part.blocks
        if self.store is None:
            self.store = StoreClient(self.executor.service.table, self.executor.client)
        return {"op": "ok", "rows": part.num_rows, "data_bytes": part.nbytes,
                "blocks": [b.block_index for b in part.blocks]}, ()

    async def load_splits(self, frame: Frame) -> Reply:
        """Generate (or read) exactly the given input blocks, in split order, as this worker's
        active splits; their positions start at (0, 0) until `set_positions`."""
        app = self._need_app()
        wanted = frame.header.get("blocks")
        if (not isinstance(wanted, list) or
                not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < app.num_blocks for b in wanted)):
            raise RequestError(f"field 'blocks' must be a list of input blocks below {app.num_blocks}")
        async with self._busy:
            if self.spill is not None:
                self.blocks = self.spill.load_blocks(app, sorted(set(wanted)))
            else:
                self.blocks = [app.input_block(b) for b in sorted(set(wanted))]
            app.release_generation_caches()
        if self.store is None:
            self.store = StoreClient(self.executor.service.table, self.executor.client)
        return {"op": "ok", "rows": sum(b.num_rows for b in self.blocks), "data_bytes": self.data_bytes(),
                "blocks": [b.block_index for b in self.blocks]}, ()

    async def init_model(self, frame: Frame) -> Reply:
        app, store = self._need_app(), self._need_store()
        await init_model(store, app)
        return {"op": "ok", "keys": app.num_keys}, ()

    async def init_blocks(self, frame: Frame) -> Reply:
        app, store = self._need_app(), self._need_store()
        if self.spill is not None:
            await self.spill.init_blocks(store, app, self.blocks)
        else:
            await init_blocks(store, app, self.blocks)
        return {"op": "ok", "blocks": len(self.blocks)}, ()

    # -- training ----------------------------------------------------------------------------
    def _clock_header(self, frame: Frame) -> tuple[int, StepContext, str | None]:
        epoch = int_field(frame.header, "epoch", 0)
        ctx = StepContext(epoch=epoch, num_workers=int_field(frame.header, "num_workers", 1))
        count_key = frame.header.get("count_key")
        if count_key is not None and not isinstance(count_key, str):
            raise RequestError("field 'count_key' must be a string key")
        return epoch, ctx, count_key

    async def run_clock(self, frame: Frame) -> Reply:
        """One clock: the next `batches` mini-batches of the epoch, flushed (see the module doc)."""
        app, store = self._need_app(), self._need_store()
        epoch, ctx, count_key = self._clock_header(frame)
        limit = int_field(frame.header, "batches", 1)
        if self._busy.locked():
            raise RequestError("a clock is already running on this executor")
        async with self._busy:
            t_start = time.perf_counter()
            times = await self._run_batches(app, store, ctx, count_key, limit)
            done = all(epoch_position(b, epoch) >= b.num_rows for b in self.blocks)
            header, arrays = _step_reply(epoch, done, times, t_start)
            self._after_step(header)
            header["positions"] = {str(b.block_index): list(block_position(b)) for b in self.blocks}
        return header, arrays

    async def run_epoch(self, frame: Frame) -> Reply:
        """The rest of the epoch (all of it, unless clocks of it ran already) in one op."""
        app, store = self._need_app(), self._need_store()
        epoch, ctx, count_key = self._clock_header(frame)
        with_objective = bool(frame.header.get("with_objective", False))
        if self._busy.locked():
            raise RequestError("an epoch is already running on this executor")
        async with self._busy:
            t_start = time.perf_counter()
            times = await self._run_batches(app, store, ctx, count_key, None)
            header, arrays = _step_reply(epoch, True, times, t_start)
            self._after_step(header)
            if with_objective:
                part = await self.pipeline.objective(app, store, self.blocks)
                header["objective"] = [part.value, part.count]
        return header, arrays

    def _after_step(self, header: dict[str, Any]) -> None:
        """With spill: the step's stall time and alpha in the reply, alpha tuned for the next step."""
        if self.spill is not None:
            header["spill"] = self.spill.after_step(self.blocks, float(header["seconds"]))

    def materialize(self, block: DataBlock) -> None:
        """Bring a spilled block's data back into memory for good (before it leaves this worker)."""
        if self.spill is not None:
            self.spill.reloader.materialize(block)

    def spill_figures(self) -> dict[str, Any] | None:
        """alpha, bytes spilled, stall seconds ... of this worker, or a server's bytes and model
        blocks spilled (None without spill)."""
        if self.spill is None:
            return None
        figures: dict[str, Any] = self.spill.figures() if self.blocks else {"alpha": None}
        if self.model_spill is not None:
            figures.update(self.model_spill.figures())
        figures["spilled_bytes"] = self.spill.reloader.store.nbytes()    # input and model files
        return figures

    async def _run_batches(self, app: PSApp, store: StoreClient, ctx: StepContext, count_key: str | None,
                           limit: int | None) -> StepTimes:
        """The pipeline's mini-batches of this step, from each block's position (see the module doc)."""
        self.stop.clear()
        try:
            return await self.pipeline.run_batches(app, store, self.blocks, ctx, limit, count_key, self.stop)
        except TrainingStopped as e:
            raise RequestError(str(e)) from None

    async def block_states(self, frame: Frame) -> Reply:
        """The worker-local state of every held block, for a checkpoint: one block header each
        (DataBlock.to_buffers of the block without its input data), the arrays in the buffers."""
        headers: list[dict[str, Any]] = []
        arrays: list[np.ndarray] = []
        async with self._busy:         # at a clock boundary: no training step changes the state
            for b in self.blocks:
                h, bufs = DataBlock(b.app, b.block_index, b.row_start, b.num_rows, {}, b.state).to_buffers()
                headers.append(h)
                arrays.extend(np.ascontiguousarray(x) for x in bufs)
        return {"op": "ok", "blocks": headers}, arrays

    async def set_block_states(self, frame: Frame) -> Reply:
        """Put held blocks' state back from a checkpoint (all of them or none)."""
        headers = frame.header.get("blocks")
        if not isinstance(headers, list):
            raise RequestError("field 'blocks' must be a list of block headers")
        held = {b.block_index: b for b in self.blocks}
        states: list[tuple[DataBlock, dict[str, np.ndarray]]] = []
        at = 0
        for h in headers:
            n = len(h.get("arrays", [])) if isinstance(h, dict) else 0
            try:
                incoming = DataBlock.from_buffers(h, frame.arrays[at:at + n])
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
        return {"op": "ok", "blocks": [b.block_index for b, _ in states]}, ()

    def positions(self, frame: Frame) -> Reply:
        """Each block's position in the epoch: {block: [epoch, next_row]} (for a restart)."""
        return {"op": "ok", "positions": {str(b.block_index): list(block_position(b)) for b in self.blocks}}, ()

    async def set_positions(self, frame: Frame) -> Reply:
        """Set the positions of the blocks held here that appear in {block: [epoch, next_row]}
        (a restarted job continues the epoch where the old one stopped)."""
        given = frame.header.get("positions")
        if not isinstance(given, dict):
            raise RequestError("field 'positions' must be an object {block: [epoch, next_row]}")
        parsed: dict[int, tuple[int, int]] = {}
        for k, v in given.items():
            if (not isinstance(k, str) or not k.isdigit() or not isinstance(v, list) or len(v) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)):
                raise RequestError(f"bad position {k!r}: {v!r} (want \"<block>\": [epoch, next_row])")
            parsed[int(k)] = (v[0], v[1])
        async with self._busy:
            applied = 0
            for b in self.blocks:
                if b.block_index in parsed:
                    e, row = parsed[b.block_index]
                    set_epoch_position(b, e, min(row, b.num_rows))
                    applied += 1
        return {"op": "ok", "applied": applied}, ()

    async def objective(self, frame: Frame) -> Reply:
        app, store = self._need_app(), self._need_store()
        part = await self.pipeline.objective(app, store, self.blocks)
        return {"op": "ok", "value": part.value, "count": part.count}, ()

    def server_objective(self, frame: Frame) -> Reply:
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
        return {"op": "ok", "value": value, "keys": count}, ()

    def stop_training(self, frame: Frame) -> Reply:
        self.stop.set()
        return {"op": "ok"}, ()


def _step_reply(epoch: int, done: bool, times: StepTimes, t_start: float) -> Reply:
    """A run_clock / run_epoch reply: counts and sums in the header, the per-mini-batch compute and
    communication times as two float64 buffers."""
    header: dict[str, Any] = {
        "op": "ok", "epoch": epoch, "batches": times.batches, "epoch_done": done,
        "compute_s": float(sum(times.compute)), "comm_s": float(sum(times.comm)),
        "seconds": time.perf_counter() - t_start}
    return header, [np.asarray(times.compute, np.float64), np.asarray(times.comm, np.float64)]
