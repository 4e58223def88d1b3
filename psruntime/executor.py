"""The per-container executor process: serves the elastic store and the AM's control channel.

Run as::

    python -m psruntime.executor --executor-id E --port 0 --num-blocks 64 [--am HOST:PORT]
                                 [--role server|worker] [--ready-file F]

Everything (data ops, migration, control) travels on the one binary frame protocol
(psruntime.wire.frame_codec / psruntime.wire.dataplane). Control ops from the AM:

    set_ownership {table}          adopt a newer ownership table (initial placement, broadcasts)
    move_blocks {blocks, dst, dst_address}   run the two-step migration as the source
    switch_role {role}             worker <-> server in place (a server must hold no blocks first)
    status                         pid, role, RSS from /proc/self/status, blocks, table version
    checkpoint_blocks / restore_blocks_data / checkpoint / restore   model blocks out to the AM and
                                   back (psruntime.checkpoint_ops, via register_ops)
    app_setup, worker_setup, run_clock, ...      AM-paced app ops (psruntime.app_role, via register_ops;
                                                 the AM paces the clocks, BSP or SSP)
    eps_join, eps_send_data, eps_commit, ...     EPS worker-to-worker split transmission
                                                 (psruntime.eps.eps_worker_ops, via register_ops)
    shutdown                       reply, then stop the process cleanly (as SIGTERM does)
    ping, take_ownership, block_data, cancel_incoming   who-are-you; migration, source -> destination

Each control request is decoded once into its record of protocol.executor_ops (by its op tag) and
dispatched by type to its handler, `(request, arrays) -> (reply record, arrays)`: a misspelt or
ill-typed field is refused with an ErrorReply naming it before any op runs, and nothing changes; a
failing op is answered with an ErrorReply of the error's kind (RequestError, UserCodeError, ...).
The data ops (get / put / update) keep their compact headers (psruntime.store.store_requests).

On start it writes `--ready-file` (JSON: pid, executor_id, address) atomically and, with `--am`,
announces itself to the AM with an "executor_ready" frame (protocol.executor_ops.ExecutorReady,
answered Ok).

With ELASTANE_JOB_SECRET in its environment (a PS AM always sets it; never a flag, so it is not
on a command line) every data-plane connection it serves or opens -- the AM's, workers', peers'
for migration and EPS split transfers -- is authenticated (psruntime.wire.dataplane_auth); without it
the executor serves unauthenticated, as in-process tests and tools do.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import ctypes.util
import functools
import gc
import inspect
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable, Optional, cast

from protocol import container_env
from protocol.daemon import install_uvloop, setup_logging
from protocol.durable_storage import write_atomic
from protocol import executor_ops as ops
from protocol.executor_ops import ControlMessageError, ExecutorRequest, decode_as
from protocol.json_types import JsonInObject
from psruntime import harmony_runner
from psruntime.blas_threads import limit_blas_threads_to_cgroup
from psruntime.app_role import AppRole
from psruntime.wire.bandwidth import process_pacer
from psruntime.checkpoint_ops import CheckpointOps
from psruntime.control_ops import Answer, Arrays, Handler, OpTable, bind, op_name, table
from psruntime.wire.dataplane import DataPlaneClient, DataPlaneServer, Reply, RequestError
from psruntime.wire.dataplane_auth import secret_key
from psruntime.eps.eps_worker_ops import INACTIVE_DIR, EpsWorkerOps
from psruntime.wire.frame_codec import Frame
from psruntime.store.migration import BlockState
from psruntime.store.ownership_table import OwnershipTable
from psruntime.store.store_service import DATA_OPS, StoreService
from psruntime.training_pipeline import SubtaskRunner

log = logging.getLogger(__name__)
ROLES = ("worker", "server")
# A directory: the executor runs under cProfile and writes executor-<id>-<pid>.prof there when it
# stops (profiling the data plane's hot path; the tools' own cost inflates small calls' times).
PROFILE_DIR_ENV = "ELASTANE_EXECUTOR_PROFILE_DIR"


def read_rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/status (VmRSS)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _usable_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS has one): what the Cruise cost
    model counts as the host's cores its workers share."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Executor:
    """One Elastic Executor: a data-plane server over a StoreService, plus control ops; with a
    job `secret` (HMAC key) it serves and connects only with the data-plane handshake."""

    def __init__(self, executor_id: str, num_blocks: int, host: str = "127.0.0.1", port: int = 0,
                 role: str = "server", secret: bytes | None = None, runner: SubtaskRunner | None = None,
                 work_dir: Path | None = None) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        self.executor_id = executor_id
        self.role = role
        self.client = DataPlaneClient(secret=secret)
        # Version -1: any table from the controller, even its first (version 0), is newer.
        empty = OwnershipTable(num_blocks, [""] * num_blocks, version=-1)
        self.service = StoreService(executor_id, empty, self.client)
        self.am_address: str | None = None
        # Control ops by request type (psruntime.control_ops): the built-ins, then the other layers'
        # on the same channel (app ops, EPS, checkpoints); a second handler for an op is refused.
        self._handlers: OpTable = {}
        self._kinds: dict[str, type[ExecutorRequest]] = {}
        self.register_ops(self._builtin_ops())
        self.app_role = AppRole(self, runner)
        self.register_ops(self.app_role.ops())
        # EPS worker-to-worker data transmission; inactive splits go under `work_dir` (default: the
        # process's working dir, a container's own).
        self.eps = EpsWorkerOps(self.app_role, None if work_dir is None else work_dir / INACTIVE_DIR)
        self.register_ops(self.eps.ops())
        self.checkpoints = CheckpointOps(executor_id, self.service)
        self.register_ops(self.checkpoints.ops())
        self.server = DataPlaneServer(self.handle, host, port, secret=secret)
        self.stopped = asyncio.Event()
        self.address = ""
        self.data_busy_s = 0.0     # seconds spent serving data ops (get/put/update frames)
        self.data_requests = 0
        self.bytes_served = 0      # bytes of the data replies it sent

    async def start(self) -> str:
        self.address = await self.server.start()
        self.service.address = self.address
        self.service.table.addresses[self.executor_id] = self.address
        return self.address

    async def stop(self) -> None:
        await self.server.stop()
        # A training step runs detached from its request (psruntime.app_role): closing the
        # connections does not end it, so it is stopped (and cancelled after a short grace) here.
        await self.app_role.end_steps()
        self.app_role.close()
        await self.client.close()

    def register_ops(self, ops: OpTable) -> None:
        """Add control ops (request type -> handler, psruntime.control_ops); an op tag already
        served (a built-in, a data op, or registered before) is refused."""
        clash = sorted(op_name(k) for k in ops if op_name(k) in self._kinds or op_name(k) in DATA_OPS)
        if clash:
            raise ValueError(f"ops {clash} are built into the executor")
        self._handlers.update(ops)
        self._kinds.update({op_name(k): k for k in ops})

    def replace_op(self, kind: type[ExecutorRequest], handler: Handler) -> None:
        """Serve requests of an op already served with `handler` instead (a layer wrapping another's op)."""
        if kind not in self._handlers:
            raise ValueError(f"no op {op_name(kind)!r} to replace")
        self._handlers[kind] = handler

    def handler_of(self, kind: type[ExecutorRequest]) -> Handler:
        """The handler that serves requests of type `kind` (KeyError if none)."""
        return self._handlers[kind]

    @property
    def request_types(self) -> frozenset[type[ExecutorRequest]]:
        """Every request type this executor serves."""
        return frozenset(self._handlers)

    # -- dispatch ----------------------------------------------------------------------------
    def handle(self, frame: Frame) -> Reply | Awaitable[Reply]:
        h = frame.header
        op = h.get("op")
        if op in DATA_OPS:
            # Service time of the data plane (what the AM's optimizer reads per server): the
            # synchronous handling of a request; a request queued on a moving block counts only its
            # dispatch, as its wait is the migration's, not the server's work.
            t0 = time.perf_counter()
            try:
                reply = self.service.handle_data(frame)
                if isinstance(reply, tuple):
                    for a in reply[1]:
                        self.bytes_served += a.nbytes
                return reply
            finally:
                self.data_busy_s += time.perf_counter() - t0
                self.data_requests += 1
        kind = self._kinds.get(op) if isinstance(op, str) else None
        if kind is None:
            return _error("RequestError", f"unknown op {op!r}")
        try:
            request = decode_as(h, kind)   # decoded once: no handler sees the header
        except ControlMessageError as e:
            return _error("RequestError", str(e))
        try:
            outcome = self._handlers[kind](request, frame.arrays)
        except Exception as e:  # noqa: BLE001 - a failed op is answered, never fatal
            return _error(type(e).__name__, str(e))
        if inspect.isawaitable(outcome):
            return _answer_later(outcome)
        return _encode(outcome)

    def _op_take_ownership(self, req: ops.TakeOwnership, arrays: Arrays) -> Answer:
        self.service.take_ownership(req.blocks, req.src)
        return ops.Ok(), ()

    def _op_block_data(self, req: ops.BlockData, arrays: Arrays) -> Answer:
        self.service.receive_block(req.block, req.keys, arrays, req.applied, req.src)
        return ops.Ok(), ()

    def _op_cancel_incoming(self, req: ops.CancelIncoming, arrays: Arrays) -> Answer:
        cancelled, owned = self.service.cancel_incoming(req.blocks, req.src)
        return ops.CancelIncomingReply(cancelled=cancelled, owned=owned), ()

    async def _op_move_blocks(self, req: ops.MoveBlocks, arrays: Arrays) -> Answer:
        done, failed = await self.service.move_blocks(req.blocks, req.dst, req.dst_address)
        return ops.MoveBlocksReply(moved=done, failed=failed), ()

    def _op_set_ownership(self, req: ops.SetOwnership, arrays: Arrays) -> Answer:
        table = OwnershipTable.from_wire(req.table)
        adopted = self.service.apply_table(table)
        if adopted:       # an address a newer table names is served (again: a port reused after ReleaseServers)
            for address in table.addresses.values():
                self.client.clear_lost(address)
        return ops.SetOwnershipReply(adopted=adopted, version=self.service.table.version), ()

    def _op_switch_role(self, req: ops.SwitchRole, arrays: Arrays) -> Answer:
        role = req.role
        if role == "worker" and self.service.owned_blocks():
            raise RequestError(f"move blocks {self.service.owned_blocks()} away before switching to worker")
        if role == "server" and self.app_role.step_lock.locked():
            raise RequestError("a training step is running; switch to server between steps")
        old, self.role = self.role, role
        log.info("executor %s switched role %s -> %s", self.executor_id, old, role)
        return ops.SwitchRoleReply(role=role, previous=old), ()

    def _op_status(self, req: ops.Status, arrays: Arrays) -> Answer:
        svc = self.service
        pacer = process_pacer()
        return ops.StatusReply(
            executor_id=self.executor_id, pid=os.getpid(), role=self.role, address=self.address,
            rss_bytes=read_rss_bytes(), blocks=svc.owned_blocks(), store_bytes=svc.store.nbytes(),
            table_version=svc.table.version, incoming=svc.states.blocks_in(BlockState.INCOMING),
            requests=dict(svc.stats), data_requests=self.data_requests, busy_s=self.data_busy_s,
            data_bytes=self.app_role.data_bytes(), bytes_served=self.bytes_served,
            train_counters=dict(self.app_role.counters), spill=self.app_role.spill_figures(),
            link_bps=pacer.bps if pacer is not None else None,
            host=socket.gethostname(), host_cores=_usable_cores()), ()

    def _op_ping(self, req: ops.Ping, arrays: Arrays) -> Answer:
        return ops.PingReply(executor_id=self.executor_id), ()

    def _op_shutdown(self, req: ops.Shutdown, arrays: Arrays) -> Answer:
        # Reply first; the main loop stops after the reply has been written.
        asyncio.get_running_loop().call_soon(self.stopped.set)
        return ops.Ok(), ()

    def _builtin_ops(self) -> OpTable:
        return table(bind(ops.TakeOwnership, self._op_take_ownership), bind(ops.BlockData, self._op_block_data),
                     bind(ops.CancelIncoming, self._op_cancel_incoming), bind(ops.MoveBlocks, self._op_move_blocks),
                     bind(ops.SetOwnership, self._op_set_ownership), bind(ops.SwitchRole, self._op_switch_role),
                     bind(ops.Status, self._op_status), bind(ops.Ping, self._op_ping),
                     bind(ops.Shutdown, self._op_shutdown))


def _encode(answer: Answer) -> Reply:
    reply, arrays = answer
    return ops.encode_reply(reply), arrays


def _error(kind: str, message: str) -> Reply:
    """The typed error reply (the data-plane client raises it as RemoteError(kind, message))."""
    return ops.encode_reply(ops.ErrorReply(kind=kind, error=message)), ()


async def _answer_later(outcome: Awaitable[Answer]) -> Reply:
    try:
        return _encode(await outcome)
    except Exception as e:  # noqa: BLE001 - a failed op is answered, never fatal
        return _error(type(e).__name__, str(e))


# glibc mallopt parameters (malloc.h) and the values the executor uses.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD_BYTES = 256 << 10
TRIM_THRESHOLD_BYTES = 1 << 20
ARENA_MAX = 2


@functools.cache
def _mallopt() -> Optional[Callable[[int, int], int]]:
    """glibc's mallopt, looked up once (find_library may run ldconfig, some ms)."""
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        return cast(Callable[[int, int], int], ctypes.CDLL(path).mallopt)
    except (OSError, AttributeError):
        return None


def warm_up() -> None:
    """Called once by the NM's executor zygote after it preloaded this module (nodemanager.zygote):
    what every executor forked from it would otherwise do again before serving."""
    _mallopt()


def tune_malloc() -> bool:
    """Keep freed memory from inflating the executor's RSS; True if glibc took the settings.

    glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), so
    after the first freed temporary, data-generation and pull/push arrays of a few MiB come from
    the brk heap, where blocks held for the whole job pin the freed temporaries between them:
    the RSS stayed 2x the held data after generation. A fixed threshold keeps arrays over 256 KiB
    in their own mappings (returned to the kernel on free) and disables the dynamic raise; a trim
    threshold returns the heap's free top; two arenas bound what BLAS / resolver threads can pin.
    Environment settings (MALLOC_MMAP_THRESHOLD_ etc.) win: they are left alone if present.
    """
    mallopt = _mallopt()
    if mallopt is None:
        return False   # no libc found, or not glibc (musl has no mallopt): nothing to tune
    ok = True
    for env, param, value in (("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
                              ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
                              ("MALLOC_ARENA_MAX", _M_ARENA_MAX, ARENA_MAX)):
        if env not in os.environ:
            ok = bool(mallopt(param, value)) and ok
    return ok


def _write_ready_file(path: str, payload: JsonInObject) -> None:
    # atomic, not durable: it describes this process only
    write_atomic(path, json.dumps(payload).encode(), durable=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m psruntime.executor", description=__doc__.split("\n")[0])
    p.add_argument("--executor-id", required=True)
    p.add_argument("--host", default=os.environ.get(container_env.NM_HOST) or "127.0.0.1",
                   help="the address to serve on and advertise (default: the container's $NM_HOST, the "
                        "NM's advertised address; else 127.0.0.1)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--num-blocks", type=int, default=64)
    p.add_argument("--role", choices=ROLES, default="server")
    p.add_argument("--am", default=None, help="the AM's data-plane address host:port to announce to")
    p.add_argument("--ready-file", default=None)
    p.add_argument("--log-level", default=None)
    args = p.parse_args(argv)
    if args.num_blocks <= 0:
        p.error("--num-blocks must be positive")
    return args


async def run(args: argparse.Namespace) -> None:
    secret = secret_key(os.environ.get(container_env.JOB_SECRET))
    # A Harmony job's executor takes its node's arbiter slots around every subtask; others never touch it.
    runner = await harmony_runner.from_environment()
    ex = Executor(args.executor_id, args.num_blocks, args.host, args.port, args.role, secret=secret, runner=runner)
    ex.am_address = args.am
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ex.stopped.set)
    address = await ex.start()
    log.info("executor %s serving on %s as %s (%s)", args.executor_id, address, args.role,
             "authenticated data plane" if secret else "no job secret: unauthenticated data plane")
    if args.ready_file:
        _write_ready_file(args.ready_file, {"pid": os.getpid(), "executor_id": args.executor_id,
                                            "address": address})
    if args.am:
        try:
            ready = ops.ExecutorReady(executor_id=args.executor_id, address=address, pid=os.getpid(),
                                      role=cast(ops.RoleName, ex.role))
            reply = await ex.client.request(args.am, ops.to_header(ready))
            ops.decode_reply(reply.header, ops.Ok)
        except Exception as e:  # noqa: BLE001 - the AM may retry through the ready file; keep serving
            log.warning("could not announce to the AM at %s: %s", args.am, e)
    await ex.stopped.wait()
    await ex.stop()
    if runner is not None:
        await runner.close()
    log.info("executor %s stopped", args.executor_id)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tune_malloc()
    # BLAS threads no more than the host's CPU quota allows (psruntime.blas_threads): here, in
    # the executor itself, whether the zygote forked it or it was started alone.
    limit_blas_threads_to_cgroup()
    # The imported modules' objects live as long as the process: keep the collector from
    # scanning (and touching the pages of) them on every full collection.
    gc.freeze()
    setup_logging(f"executor-{args.executor_id}", args.log_level)
    install_uvloop()
    profile_dir = os.environ.get(PROFILE_DIR_ENV)
    profiler = cProfile.Profile() if profile_dir else None
    try:
        if profiler is not None:
            profiler.enable()
        asyncio.run(run(args))
    except OSError as e:
        print(f"executor: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        if profiler is not None and profile_dir:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile_dir, f"executor-{args.executor_id}-{os.getpid()}.prof"))


# What the NM's executor zygote calls in a container it forked (nodemanager.zygote), instead of
# executing this module again as __main__.
WARM_ENTRY = main

if __name__ == "__main__":
    main()
