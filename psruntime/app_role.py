"""The ML side of an executor: the control ops with which the PS AM drives training.

An executor serves the elastic store either way; these ops add the app on top (registered on the
executor's op table, see `Executor.extra_ops`):

    app_setup {app, preset, data, hparams}   bind the ML app (servers need it for their objective part)
    worker_setup {partition, num_partitions} generate this worker's input partition
    init_model {}                            put every model key's initial value (one worker does it)
    init_blocks {}                           initialise the blocks' local state, push what it yields
    run_clock {epoch, batches, num_workers, count_key?}
                                             one clock (BSP iteration): the next `batches` mini-batches
                                             of the epoch, PULL -> COMP -> PUSH each, flushed at the end;
                                             with count_key, also push +1 to that key per mini-batch
                                             (an audit: the servers count the mini-batches applied).
                                             Reply: counts and sums, `epoch_done` (every block held
                                             here has had its pass of the epoch), and the
                                             per-mini-batch compute / communication times as two
                                             float64 buffers (no JSON for arrays)
    run_epoch {epoch, num_workers, with_objective?, count_key?}
                                             the rest of the epoch in one op (all of it if no clock of
                                             it ran); with_objective, the worker's objective part too
    positions {} / set_positions {positions}  every held block's position in its epoch pass
    objective {}                             this worker's objective part under the current model
    server_objective {}                      the app's server part over the keys this executor owns
    stop_training {}                         abandon a running epoch at the next mini-batch

Clocks are paced by the AM (BSP: it waits for every worker before the next clock; SSP: it keeps
each worker within the staleness bound, in clocks), so the objective it gathers between epochs is
exact under BSP. A worker keeps its place in the epoch across clocks in each block's state
(`[epoch, next_row]`, key POSITION): the place travels with a block that EPS moves to another
worker between two clocks, so an epoch is still every input block trained exactly once, whoever
holds it when.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import numpy as np

from psruntime.apps.base import AppConfigError, KeyValues, ObjectivePart, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.registry import create_app
from psruntime.dataplane import Reply, RequestError
from psruntime.frame_codec import Frame
from psruntime.request_fields import int_field
from psruntime.store_client import StoreClient
from psruntime.worker_loop import WorkerLoop, init_model, pull_key_values, push_key_values

if TYPE_CHECKING:  # the executor imports this module, not the other way round at run time
    from psruntime.executor import Executor

Op = Callable[[Frame], "Reply | Awaitable[Reply]"]


def _kv_bytes(kv: KeyValues | None) -> int:
    """Bytes a pull or push of `kv` carries (keys and values)."""
    return 0 if kv is None else int(kv.keys.nbytes + kv.values.nbytes)


class AppRole:
    """The app-level state of one executor: the app, and for a worker its partition and store client."""

    def __init__(self, executor: "Executor") -> None:
        self.executor = executor
        self.app: PSApp | None = None
        self.blocks: list[DataBlock] = []
        self.store: StoreClient | None = None
        self.stop = asyncio.Event()
        self._busy = asyncio.Lock()   # one training step at a time on this executor
        # Cumulative training figures (the AM's Cruise driver differences them per epoch).
        self.counters = {"batches": 0, "samples": 0, "bytes": 0}

    def ops(self) -> dict[str, Op]:
        return {"app_setup": self.app_setup, "worker_setup": self.worker_setup, "init_model": self.init_model,
                "init_blocks": self.init_blocks, "run_epoch": self.run_epoch, "run_clock": self.run_clock,
                "positions": self.positions, "set_positions": self.set_positions, "objective": self.objective,
                "server_objective": self.server_objective, "stop_training": self.stop_training}

    def data_bytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)

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
        part = app.generate_partition(i, n)
        self.blocks = part.blocks
        if self.store is None:
            self.store = StoreClient(self.executor.service.table, self.executor.client)
        return {"op": "ok", "rows": part.num_rows, "data_bytes": part.nbytes,
                "blocks": [b.block_index for b in part.blocks]}, ()

    async def init_model(self, frame: Frame) -> Reply:
        app, store = self._need_app(), self._need_store()
        await init_model(store, app)
        return {"op": "ok", "keys": app.num_keys}, ()

    async def init_blocks(self, frame: Frame) -> Reply:
        app, store = self._need_app(), self._need_store()
        await WorkerLoop(app, self.blocks, store).initialise()
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
            self.stop.clear()
            stats = _ClockStats()
            await self._run_batches(app, store, epoch, ctx, count_key, limit, stats)
            done = all(epoch_position(b, epoch) >= b.num_rows for b in self.blocks)
            header = stats.header(epoch, done)
        return header, stats.arrays()

    async def run_epoch(self, frame: Frame) -> Reply:
        """The rest of the epoch (all of it, unless clocks of it ran already) in one op."""
        app, store = self._need_app(), self._need_store()
        epoch, ctx, count_key = self._clock_header(frame)
        with_objective = bool(frame.header.get("with_objective", False))
        if self._busy.locked():
            raise RequestError("an epoch is already running on this executor")
        async with self._busy:
            self.stop.clear()
            stats = _ClockStats()
            await self._run_batches(app, store, epoch, ctx, count_key, None, stats)
            header = stats.header(epoch, True)
            if with_objective:
                part = await self._objective(app, store)
                header["objective"] = [part.value, part.count]
        return header, stats.arrays()

    async def _run_batches(self, app: PSApp, store: StoreClient, epoch: int, ctx: StepContext,
                           count_key: str | None, limit: int | None, stats: "_ClockStats") -> None:
        """PULL -> COMP -> PUSH for up to `limit` (None: all) of the epoch's remaining mini-batches,
        in block order from each block's position, then flush (the pushes are applied before the
        AM moves on). Each block's position is in its state, so it travels with the block."""
        one = [np.ones(1, np.float32)]
        compute, comm = stats.compute, stats.comm
        for block in self.blocks:
            if limit is not None and len(compute) >= limit:
                break
            pos = epoch_position(block, epoch)
            if pos >= block.num_rows:
                continue
            for batch in app.batches(block):
                if batch.start < pos:
                    continue                   # run in an earlier clock of this epoch
                if limit is not None and len(compute) >= limit:
                    break
                if self.stop.is_set():
                    raise RequestError(f"epoch {epoch} stopped by the AM")
                t0 = time.perf_counter()
                params = await pull_key_values(store, app.keys_for_batch(batch), app.key_length)
                t1 = time.perf_counter()
                deltas = app.compute(batch, params, ctx)
                t2 = time.perf_counter()
                await push_key_values(store, deltas)   # asynchronous: waits only for backpressure
                if count_key is not None:
                    await store.push([count_key], one)
                t3 = time.perf_counter()
                set_epoch_position(block, epoch, batch.stop)
                compute.append(t2 - t1)
                self.counters["batches"] += 1
                self.counters["samples"] += batch.size
                self.counters["bytes"] += _kv_bytes(params) + _kv_bytes(deltas)
                comm.append((t1 - t0) + (t3 - t2))
                # Drop this batch's pulled values and deltas before the next pull: held across
                # it, they would double the per-batch arrays at the worker's memory peak.
                del params, deltas
        t_flush = time.perf_counter()
        await store.flush()
        if comm:
            comm[-1] += time.perf_counter() - t_flush

    def positions(self, frame: Frame) -> Reply:
        """Each block's position in the epoch: {block: [epoch, next_row]} (for a restart)."""
        return {"op": "ok", "positions": {str(b.block_index): list(_position(b)) for b in self.blocks}}, ()

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

    async def _objective(self, app: PSApp, store: StoreClient) -> ObjectivePart:
        part = ObjectivePart()
        for block in self.blocks:
            params = await pull_key_values(store, app.objective_keys(block), app.key_length)
            part = part + app.objective(block, params)
            del params     # not held across the next block's pull
        return part

    async def objective(self, frame: Frame) -> Reply:
        app, store = self._need_app(), self._need_store()
        part = await self._objective(app, store)
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


POSITION = "_epoch_position"     # block state: int64 [epoch, next_row] of the block's pass


def _position(block: DataBlock) -> tuple[int, int]:
    p = block.state.get(POSITION)
    return (0, 0) if p is None else (int(p[0]), int(p[1]))


def epoch_position(block: DataBlock, epoch: int) -> int:
    """The first row of `block` not yet trained in `epoch` (0 if the block's pass is of an earlier
    epoch, num_rows if it is of a later one: nothing left to do in `epoch`)."""
    e, row = _position(block)
    if e < epoch:
        return 0
    return row if e == epoch else block.num_rows


def set_epoch_position(block: DataBlock, epoch: int, row: int) -> None:
    block.state[POSITION] = np.array([epoch, row], np.int64)


class _ClockStats:
    """Per-mini-batch compute and communication times of one clock (or epoch) on this worker."""

    def __init__(self) -> None:
        self.compute: list[float] = []
        self.comm: list[float] = []
        self.t_start = time.perf_counter()

    def header(self, epoch: int, done: bool) -> dict[str, Any]:
        return {"op": "ok", "epoch": epoch, "batches": len(self.compute), "epoch_done": done,
                "compute_s": float(sum(self.compute)), "comm_s": float(sum(self.comm)),
                "seconds": time.perf_counter() - self.t_start}

    def arrays(self) -> list[np.ndarray]:
        return [np.asarray(self.compute, np.float64), np.asarray(self.comm, np.float64)]
