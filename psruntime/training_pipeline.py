"""A worker's training pipeline: PULL -> COMP -> PUSH per mini-batch, as subtasks behind a runner.

Per mini-batch the pipeline runs three subtasks, one after the other (README "Architecture", psruntime):

    PULL  (COMM)  the batch's model keys from their owners
    COMP  (CPU)   app.compute, in the pipeline's compute thread: numpy releases the GIL, so the
                  event loop keeps serving pushes, pulls, flushes and block reloads meanwhile
                  (a COMP of under a millisecond runs on the loop: see ComputeThread)
    PUSH  (COMM)  the deltas (and the audit count), asynchronous: it waits only for backpressure

A `SubtaskRunner` decides when each subtask runs: `await runner.run(kind, work)`. The default,
`ImmediateRunner`, runs it at once. A Harmony runner takes a slot of `kind.resource` from its node's
arbiter before `await work()` and gives it back after, with no change here. `work` is exactly the
subtask (the compute thread hand-off included), so what is not its job stays outside it: the
batch's keys are chosen before PULL's work, and a pull or push is split into encode / transfer /
decode (`StoreClient.prepare_*`, `send_*`, `finish_pull`) of which the runner gets only the
transfer, so (de)serialization never holds a network slot (dissertation §4.3.1). A runner that is
also a `TransferGate` (Harmony's) paces the transfer's per-owner pieces.

COMP runs one at a time and in order (one thread), and a batch's PULL waits for the previous
batch's PUSH: the math is that of a sequential loop, so the same seed trains the same trajectory.
A batch's compute time is its COMP subtask and its communication time its PULL and PUSH (the last
batch's also the flush), each as the runner ran it: time a runner waits for a slot counts in. A
runner that is also a `WaitCounter` (Harmony's) says how much of that was waiting for a grant, which
`StepTimes` keeps beside it per batch: the time *held* (compute minus its wait) is what the subtask
itself took, the profile Harmony groups by (dissertation §4.3.2; a job's T_cpu measured while it
queues behind its partners' COMPs would absorb them).
The objective part runs the same way (PULL, then COMP in the thread, per block).

Where each block's input data is while a step runs is the pipeline's `residency`: all in memory by
default; with Harmony's spill a `block_reloader.BlockReloader`, which keeps some blocks on disk and
reloads each ahead of its use (the step `acquire`s a block before its batches, `release`s it after).

A worker's place in an epoch is in each block's state (`[epoch, next_row]`, key POSITION), so it
travels with a block that EPS moves between two clocks. Each mini-batch's pushes carry a push id
(psruntime.store.push_ids: split, epoch, first row), so a clock that a replacement worker runs again
applies none of them twice.
"""
from __future__ import annotations

import asyncio
import enum
import functools
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, Union, runtime_checkable

import msgspec
import numpy as np

from psruntime.apps.base import Batch, KeyValues, ObjectivePart, OutputCheck, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.store.push_ids import COUNT, DELTAS, push_id
from psruntime.store.store_client import PreparedArray, StoreClient, TransferGate
from psruntime.write_back_cache import WriteBackCache
from protocol.errors import StateError

T = TypeVar("T")
INIT_CHUNK_KEYS = 4096
INLINE_MAX_S = 0.001    # a COMP that took under this runs the next one on the event loop (ComputeThread)
# The same in sync windows (sync_batches > 1): no push is in flight while a window's COMPs run, so
# holding the loop delays only the previous window's acknowledgements and the AM's requests, by one
# COMP at most, while the thread's hand-off and GIL switches cost ~5 % of a 1.3 ms NMF COMP.
WINDOW_INLINE_MAX_S = 0.01
POSITION = "_epoch_position"     # block state: int64 [epoch, next_row] of the block's pass


class Resource(enum.Enum):
    """What a subtask occupies on its node (what a per-node arbiter hands out slots of)."""

    CPU = "cpu"
    COMM = "comm"


class Subtask(enum.Enum):
    """The subtasks of one mini-batch, in the order they run."""

    PULL = "pull"
    COMP = "comp"
    PUSH = "push"

    @property
    def resource(self) -> Resource:
        return Resource.CPU if self is Subtask.COMP else Resource.COMM


PushRecorder = Callable[[Union[np.ndarray, str], np.ndarray], None]


class SubtaskRunner(Protocol):
    """Runs the pipeline's subtasks: `run(kind, work)` returns `await work()`, run when the runner
    lets it (see the module doc)."""

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[T]]) -> T: ...


@runtime_checkable
class WaitCounter(Protocol):
    """A runner that counts the seconds its subtasks waited for a slot, cumulatively per resource."""

    wait_s: dict[Resource, float]


@runtime_checkable
class ThreadedRunner(Protocol):
    """A runner that asks for as many cores as a COMP's threads (Harmony's, of its node's CPU pool)."""

    comp_threads: int


class BlockResidency(Protocol):
    """Where a step's input blocks' data is: `plan` names the blocks a step visits, in order, and
    `acquire` / `release` bracket each block's use (psruntime.spill.block_reloader keeps some on disk)."""

    def plan(self, blocks: Sequence[DataBlock]) -> None: ...

    async def acquire(self, block: DataBlock) -> None: ...

    def release(self, block: DataBlock) -> None: ...


class AllInMemory:
    """The default residency: every block's data is in memory all the time."""

    def plan(self, blocks: Sequence[DataBlock]) -> None:
        pass

    async def acquire(self, block: DataBlock) -> None:
        pass

    def release(self, block: DataBlock) -> None:
        pass


class ImmediateRunner:
    """The default runner: every subtask runs as soon as the pipeline reaches it."""

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[T]]) -> T:
        return await work()


class ComputeThread:
    """One thread that runs COMP off the event loop: one call at a time, in the order they came.

    A COMP that is short runs on the event loop itself: when the previous call took under
    INLINE_MAX_S, the next runs inline (and is timed, so a long one sends the following call back
    to the thread). The hand-off to the thread and back -- a queue put, the thread's wake-up, the
    result posted to the loop through its self-pipe -- cost about 30 us of CPU per call (measured
    on a 2-core VM), a sixth of a small MLR mini-batch's compute, while holding the loop for under a
    millisecond delays the replies it would have served meanwhile by no more than that.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._last_s: float | None = None     # the previous call's duration (None: none yet)
        self.inline_max_s = INLINE_MAX_S
        self._clock = clock                   # what a call's duration is read from

    @property
    def inline_next(self) -> bool:
        """The next call runs inline (the previous one was short)."""
        return self._last_s is not None and self._last_s < self.inline_max_s

    def run_inline(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the caller's thread, timed like any call (for a caller that checked
        `inline_next`: a COMP of a sync window, where the awaits around it cost a tenth of it)."""
        t0 = self._clock()
        try:
            return fn(*args)
        finally:
            self._last_s = self._clock() - t0

    async def call(self, fn: Callable[[], T]) -> T:
        if self.inline_next:
            return self.run_inline(fn)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="comp")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._timed, fn)

    def _timed(self, fn: Callable[[], T]) -> T:
        t0 = self._clock()
        try:
            return fn()
        finally:
            self._last_s = self._clock() - t0

    def close(self) -> None:
        """Let the thread go once its current call (if any) ends; a later call starts a new one."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


class TrainingStopped(StateError):
    """The stop event was set: the step ended before its next mini-batch."""


@dataclass
class StepTimes:
    """Per-mini-batch compute and communication seconds of one step (a clock or an epoch), and of
    each the part spent waiting for an arbiter's grant (0.0 without one): held = time - wait.
    `bytes`: what the step's mini-batches pulled and pushed through the store client in all (keys
    and values, whichever server they went to; the counters' "bytes")."""

    compute: list[float] = field(default_factory=list)
    comm: list[float] = field(default_factory=list)
    compute_wait: list[float] = field(default_factory=list)
    comm_wait: list[float] = field(default_factory=list)
    bytes: int = 0

    @property
    def batches(self) -> int:
        return len(self.compute)


# -- model and block setup, pulls and pushes ---------------------------------------------------
async def pull_key_values(store: StoreClient, keys: np.ndarray, key_length: int) -> KeyValues:
    """Pull int64 `keys` as a KeyValues (a key never written reads as zeros).

    One array-form request per owner: the reply's (len(keys), key_length) float32 array is used as
    is (with one owner) or gathered once, with no Python work per key.
    """
    values, _found = await store.pull_array(keys, (key_length,), np.float32)
    return KeyValues(keys, values)


async def pull_through(runner: SubtaskRunner, gate: TransferGate | None, store: StoreClient,
                       keys: np.ndarray, key_length: int) -> KeyValues:
    """PULL as a subtask of `runner`: encode before it, only the transfer in it, decode after."""
    prepared = store.prepare_pull(keys, (key_length,), np.float32)
    replies = await runner.run(Subtask.PULL, functools.partial(store.send_pull, prepared, gate))
    values, _found = await store.finish_pull(prepared, replies)
    return KeyValues(keys, values)


async def push_key_values(store: StoreClient, deltas: KeyValues | None, pid: int | None = None) -> None:
    """Push `deltas` (value += delta at the owners) as one array-form update per owner, with push
    id `pid` when given."""
    if deltas is not None and len(deltas):
        await store.push_array(deltas.keys, deltas.values, push_id=pid)


async def init_model(store: StoreClient, app: PSApp[msgspec.Struct, msgspec.Struct]) -> None:
    """Put every model key's initial value (done once per job, by one worker)."""
    keys = app.model_keys()
    for start in range(0, len(keys), INIT_CHUNK_KEYS):
        chunk = keys[start:start + INIT_CHUNK_KEYS]
        await store.put_array(chunk, app.init_value(chunk))


async def init_blocks(store: StoreClient, app: PSApp[msgspec.Struct, msgspec.Struct], blocks: Sequence[DataBlock]) -> None:
    """Initialise each block's worker-local state and push the deltas that come with it (checked:
    AppOutputError if they do not fit the model)."""
    check = OutputCheck(app)
    for block in blocks:
        await push_key_values(store, check.deltas(app.init_block(block), None, "init_block"))
    await store.flush()


# -- a block's place in the epoch ----------------------------------------------------------------
def block_position(block: DataBlock) -> tuple[int, int]:
    """(epoch, next_row) of the block's latest pass; (0, 0) for a block never trained."""
    p = block.state.get(POSITION)
    return (0, 0) if p is None else (int(p[0]), int(p[1]))


def epoch_position(block: DataBlock, epoch: int) -> int:
    """The first row of `block` not yet trained in `epoch` (0 if the block's pass is of an earlier
    epoch, num_rows if it is of a later one: nothing left to do in `epoch`)."""
    e, row = block_position(block)
    if e < epoch:
        return 0
    return row if e == epoch else block.num_rows


def set_epoch_position(block: DataBlock, epoch: int, row: int) -> None:
    block.state[POSITION] = np.array([epoch, row], np.int64)


def _kv_bytes(kv: KeyValues | None) -> int:
    """Bytes a pull or push of `kv` carries (keys and values)."""
    return 0 if kv is None else int(kv.keys.nbytes + kv.values.nbytes)


def step_windows(app: PSApp[msgspec.Struct, msgspec.Struct], blocks: Sequence[DataBlock], epoch: int,
                  k: int) -> Iterator[list[Batch]]:
    """A step's sync windows: the mini-batches of `epoch` left in `blocks`, in block order from
    each block's position, cut into runs of k (the last may be shorter). A window may span blocks:
    with per-block windows, a 40-batch block and k = 32 gave windows of 32 and 8, 20 on average.
    The windows depend only on the blocks, their order (split order, as a worker keeps them) and
    their positions, so a clock run again from where it began cuts the same ones."""
    window: list[Batch] = []
    for block in blocks:
        pos = epoch_position(block, epoch)
        if pos >= block.num_rows:
            continue
        for batch in app.batches(block):
            if batch.start < pos:
                continue                   # run in an earlier clock of this epoch
            window.append(batch)
            if len(window) == k:
                yield window
                window = []
    if window:
        yield window


# -- the pipeline ------------------------------------------------------------------------------
class TrainingPipeline:
    """A worker's mini-batch loop: PULL -> COMP -> PUSH per batch, each subtask through `runner`,
    COMP in the pipeline's compute thread. Keeps the worker's cumulative training counters."""

    def __init__(self, runner: SubtaskRunner | None = None) -> None:
        self.runner: SubtaskRunner = runner if runner is not None else ImmediateRunner()
        # A runner that paces transfers (Harmony's) is also their gate.
        self.gate: TransferGate | None = runner if isinstance(runner, TransferGate) else None
        self.waits: WaitCounter | None = runner if isinstance(runner, WaitCounter) else None
        self.compute_thread = ComputeThread()
        self.residency: BlockResidency = AllInMemory()
        self.comp_threads = 1      # threads one COMP uses (StepContext.threads; the job's comp_threads)
        # Cumulative training figures (the AM's Cruise driver differences them per epoch).
        self.counters = {"batches": 0, "samples": 0, "bytes": 0}
        # Told every push of the running clock (its keys, or the audit count's name, and values):
        # the worker's push log (psruntime.push_log); None: not kept.
        self.push_record: PushRecorder | None = None
        # Mini-batches per sync window (the job's sync_batches): 1 pulls and pushes every
        # mini-batch; k > 1 reads through a write-back cache and pushes the window's sums
        # (`_run_windows`, psruntime.write_back_cache).
        self.sync_batches = 1

    def close(self) -> None:
        self.compute_thread.close()

    def set_comp_threads(self, threads: int) -> None:
        """Let a COMP use `threads` threads, and have a runner that asks for cores ask for as many."""
        if threads < 1:
            raise ValueError(f"comp_threads must be >= 1, got {threads}")
        self.comp_threads = threads
        if isinstance(self.runner, ThreadedRunner):
            self.runner.comp_threads = threads

    async def _compute(self, fn: Callable[[], T]) -> T:
        return await self.runner.run(Subtask.COMP, functools.partial(self.compute_thread.call, fn))

    async def run_batches(self, app: PSApp[msgspec.Struct, msgspec.Struct], store: StoreClient, blocks: Sequence[DataBlock],
                          ctx: StepContext, limit: int | None = None, count_key: str | None = None,
                          stop: asyncio.Event | None = None, cut: asyncio.Event | None = None) -> StepTimes:
        """PULL -> COMP -> PUSH for up to `limit` (None: all) of epoch `ctx.epoch`'s remaining
        mini-batches, in block order from each block's position, then flush (the pushes are
        applied before the AM moves on). With `count_key`, also push +1 to that key per
        mini-batch (an audit: the servers count the mini-batches applied). Raises
        TrainingStopped when `stop` is set before a mini-batch; ends early, as if `limit` had
        been reached, when `cut` is (the AM's EndClock) -- and a cut that came while a
        mini-batch pulled ends the step before that mini-batch's COMP (nothing of it ran, so the
        next step runs it), so a boundary waits for a pull rather than a whole mini-batch.

        What the app returns is checked before the runtime uses it (`OutputCheck`): keys_for_batch's
        keys, and compute's deltas -- AppOutputError naming the app and the fault, raised before
        that mini-batch pushes anything."""
        if self.sync_batches > 1:
            self.compute_thread.inline_max_s = WINDOW_INLINE_MAX_S
            try:
                return await self._run_windows(app, store, blocks, ctx, limit, count_key, stop, cut)
            finally:
                self.compute_thread.inline_max_s = INLINE_MAX_S
        epoch = ctx.epoch
        one = [np.ones(1, np.float32)]
        times = StepTimes()
        compute, comm = times.compute, times.comm
        waited = self._waited
        check = OutputCheck(app)
        self.residency.plan([b for b in blocks if epoch_position(b, epoch) < b.num_rows])
        for block in blocks:
            if (limit is not None and len(compute) >= limit) or (cut is not None and cut.is_set()):
                break
            pos = epoch_position(block, epoch)
            if pos >= block.num_rows:
                continue
            await self.residency.acquire(block)
            for batch in app.batches(block):
                if batch.start < pos:
                    continue                   # run in an earlier clock of this epoch
                if (limit is not None and len(compute) >= limit) or (cut is not None and cut.is_set()):
                    break
                if stop is not None and stop.is_set():
                    raise TrainingStopped(f"epoch {epoch} stopped by the AM")
                t0 = time.perf_counter()
                w0 = waited()
                keys = check.batch_keys(app.keys_for_batch(batch))
                params = await pull_through(self.runner, self.gate, store, keys, app.key_length)
                if cut is not None and cut.is_set():
                    break        # the AM ended the clock during the pull: nothing of this batch ran
                t1 = time.perf_counter()
                deltas = check.deltas(await self._compute(functools.partial(app.compute, batch, params, ctx)), keys)
                t2 = time.perf_counter()
                await self._push(store, deltas, count_key, one, block.block_index, epoch, batch.start)
                t3 = time.perf_counter()
                w3 = waited()
                set_epoch_position(block, epoch, batch.stop)
                compute.append(t2 - t1)
                self.counters["batches"] += 1
                self.counters["samples"] += batch.size
                self._moved(times, params)
                self._moved(times, deltas)
                comm.append((t1 - t0) + (t3 - t2))
                times.compute_wait.append(w3[0] - w0[0])
                times.comm_wait.append(w3[1] - w0[1])
                # Drop this batch's pulled values and deltas before the next pull: held across
                # it, they would double the per-batch arrays at the worker's memory peak.
                del keys, params, deltas
            self.residency.release(block)
        await self._end_step(store, times)
        return times

    async def _run_windows(self, app: PSApp[msgspec.Struct, msgspec.Struct], store: StoreClient,
                           blocks: Sequence[DataBlock], ctx: StepContext, limit: int | None,
                           count_key: str | None, stop: asyncio.Event | None,
                           cut: asyncio.Event | None) -> StepTimes:
        """`run_batches` in sync windows of k = `sync_batches` mini-batches: the step's remaining
        mini-batches, in block order, cut into runs of k that may span blocks (`step_windows`).
        A window begins with one pull, per owner, of every row its mini-batches read; COMP reads
        the window's write-back cache and its deltas are applied there; at the window's end their
        sums are pushed, one push per owner, with the push id of the window's first mini-batch,
        and the positions of the window's blocks move past it. (Pulling each mini-batch's new rows
        as it comes cost a pull per owner per mini-batch for a model whose batches touch most, not
        all, of it: Lasso's.)

        `limit` and `cut` are honoured at window ends only (a cut that came during a window's pull
        ends the step before the window's first COMP: it had not begun), and a window abandoned by
        `stop` pushes nothing (its blocks' positions stay where it began). So every push covers a whole
        window, and a clock run again (a replacement worker's: the same splits, from the positions
        the clock began at) cuts the same windows whatever its batch limit, pushes them under the
        same ids, and the servers drop the ones they applied (psruntime.store.push_ids)."""
        k, epoch = self.sync_batches, ctx.epoch
        times = StepTimes()
        cache = WriteBackCache(app.num_keys, app.key_length)
        waited = self._waited
        compute = self.compute_thread
        direct = type(self.runner) is ImmediateRunner      # no runner to hand COMP to
        check = OutputCheck(app)
        seen = np.zeros(app.num_keys, bool)
        self.residency.plan([b for b in blocks if epoch_position(b, epoch) < b.num_rows])
        held: list[DataBlock] = []          # blocks acquired for the windows, in order

        def at_end() -> bool:
            return (limit is not None and times.batches >= limit) or (cut is not None and cut.is_set())

        try:
            for batches in step_windows(app, blocks, epoch, k):
                if at_end():
                    break
                for batch in batches:
                    if not held or batch.block is not held[-1]:
                        await self.residency.acquire(batch.block)
                        held.append(batch.block)
                t0 = time.perf_counter()
                w0 = waited()
                # checked before they index the mask (a key -1 would mark the last key's)
                batch_keys = [check.batch_keys(app.keys_for_batch(b)) for b in batches]
                for keys in batch_keys:     # the union, by a mask: a sort of them all cost Lasso 0.5 ms
                    seen[keys] = True
                union = np.flatnonzero(seen)
                seen[union] = False
                pulled = await pull_through(self.runner, self.gate, store, union, app.key_length)
                if cut is not None and cut.is_set():
                    break        # the AM ended the clock during the pull: the window had not begun
                cache.fill(union, pulled.values)
                self._moved(times, pulled)
                del pulled
                t_pull, w_pull = time.perf_counter() - t0, waited()[1] - w0[1]
                for batch, keys in zip(batches, batch_keys):
                    if stop is not None and stop.is_set():
                        cache.clear()
                        raise TrainingStopped(f"epoch {epoch} stopped by the AM")
                    t0 = time.perf_counter()
                    w0 = waited()
                    rows = cache.rows(keys)
                    params = KeyValues(keys, cache.read_rows(rows))
                    t1 = time.perf_counter()
                    deltas: KeyValues | None
                    if direct and compute.inline_next:
                        deltas = compute.run_inline(app.compute, batch, params, ctx)
                    else:
                        deltas = await self._compute(functools.partial(app.compute, batch, params, ctx))
                    deltas = check.deltas(deltas, keys)     # before the cache indexes and adds with them
                    t2 = time.perf_counter()
                    if deltas is not None and len(deltas):
                        if deltas.keys is keys:       # the pulled keys (sorted, unique): rows known
                            cache.add_rows(rows, deltas.values)
                        else:
                            cache.apply(deltas.keys, deltas.values)
                    w2 = waited()
                    times.compute.append(t2 - t1)
                    times.comm.append(t1 - t0 + t_pull)      # the window's pull counts in its first
                    times.compute_wait.append(w2[0] - w0[0])
                    times.comm_wait.append(w2[1] - w0[1] + w_pull)
                    t_pull = w_pull = 0.0
                    self.counters["batches"] += 1
                    self.counters["samples"] += batch.size
                    del params, deltas, rows
                await self._push_window(store, cache, count_key, batches, epoch, times)
                while len(held) > 1:        # blocks this window went past: their part of the step is done
                    self.residency.release(held.pop(0))
                del batch_keys, union
        finally:
            for block in held:
                self.residency.release(block)
        await self._end_step(store, times)
        return times

    async def _end_step(self, store: StoreClient, times: StepTimes) -> None:
        """Flush the step's pushes (applied before the AM moves on), as a PUSH subtask whose
        time counts in the last mini-batch's COMM."""
        t_flush, w_flush = time.perf_counter(), self._waited()
        await self.runner.run(Subtask.PUSH, functools.partial(self._flush, store))
        if times.comm:
            times.comm[-1] += time.perf_counter() - t_flush
            times.comm_wait[-1] += self._waited()[1] - w_flush[1]

    def _moved(self, times: StepTimes, kv: KeyValues | None) -> None:
        """Count what a pull or push carried, in the step's and the worker's figures."""
        n = _kv_bytes(kv)
        self.counters["bytes"] += n
        times.bytes += n

    async def _push_window(self, store: StoreClient, cache: WriteBackCache, count_key: str | None,
                           batches: list[Batch], epoch: int, times: StepTimes) -> None:
        """The window's end: push its sums (and its mini-batch count to the audit key) as the
        PUSH subtask, under the ids of its first mini-batch, then move the positions of its blocks
        past it. Its time counts in the last mini-batch's COMM."""
        t0, w0 = time.perf_counter(), self._waited()
        keys, sums = cache.take_oplog()
        first = batches[0]
        count = [np.full(1, len(batches), np.float32)]
        pushed = KeyValues(keys, sums) if len(keys) else None
        await self._push(store, pushed, count_key, count, first.block.block_index, epoch, first.start)
        for batch, after in zip(batches, batches[1:] + [None]):
            if after is None or after.block is not batch.block:
                set_epoch_position(batch.block, epoch, batch.stop)
        self._moved(times, pushed)
        times.comm[-1] += time.perf_counter() - t0
        times.comm_wait[-1] += self._waited()[1] - w0[1]

    def _waited(self) -> tuple[float, float]:
        """The runner's cumulative (CPU, COMM) seconds waited for slots; zeros without a counter."""
        w = self.waits
        return (0.0, 0.0) if w is None else (w.wait_s[Resource.CPU], w.wait_s[Resource.COMM])

    async def _push(self, store: StoreClient, deltas: KeyValues | None, count_key: str | None,
                    one: list[np.ndarray], split: int, epoch: int, start: int) -> None:
        """PUSH as a subtask: the deltas' encode before it, the (asynchronous: it waits only for
        backpressure) transfer and the audit count in it."""
        prepared = None
        record = self.push_record
        if deltas is not None and len(deltas):
            prepared = store.prepare_push(deltas.keys, deltas.values, push_id=push_id(split, epoch, start, DELTAS))
            if record is not None:
                record(deltas.keys, deltas.values)
        if count_key is not None and record is not None:
            record(count_key, one[0])
        await self.runner.run(Subtask.PUSH, functools.partial(
            self._send_push, store, prepared, count_key, one, push_id(split, epoch, start, COUNT)))

    async def _flush(self, store: StoreClient) -> None:
        # Only waits on the servers' replies: nothing of it needs the link a secondary could use.
        if self.gate is not None:
            self.gate.sent()
        await store.flush()

    async def _send_push(self, store: StoreClient, prepared: PreparedArray | None, count_key: str | None,
                         one: list[np.ndarray], count_id: int | None) -> None:
        if prepared is not None:
            await store.send_push(prepared, self.gate)
        if count_key is not None:
            await store.push([count_key], one, push_id=count_id)

    async def objective(self, app: PSApp[msgspec.Struct, msgspec.Struct], store: StoreClient, blocks: Sequence[DataBlock]) -> ObjectivePart:
        """This worker's objective part under the current model: PULL and COMP per block."""
        part = ObjectivePart()
        self.residency.plan(blocks)
        for block in blocks:
            await self.residency.acquire(block)
            params = await pull_through(self.runner, self.gate, store, app.objective_keys(block), app.key_length)
            part = part + await self._compute(functools.partial(app.objective, block, params))
            del params     # not held across the next block's pull
            self.residency.release(block)
        return part
