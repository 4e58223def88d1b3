"""Warm container starts: the NM's executor zygote (nodemanager.zygote) and the processes it forks.

A launch context may offer a *warm start* (LaunchContext.warm_start: a module and its argv, e.g.
`psruntime.executor --executor-id ...`) beside its command. When the NM runs a zygote that has
preloaded that module (NMConfig.warm_modules), the container's process is forked from the zygote
instead of exec'ing a new interpreter: the same session, cgroups, working dir, environment and log
files as the cold launch (the zygote does exactly what the wrapper script does, in the same order),
without the interpreter start-up and the imports. Anything else -- no warm start offered, a module
the zygote did not preload, a zygote that is not running -- takes the cold path, unchanged.

`WarmLauncher` owns the zygote process and the channel (protocol.zygote_wire); `WarmProcess` is a
forked container as the container manager sees a process: a pid and `wait()` -> its return code
(negative: killed by that signal), reported by the zygote, which is the child's parent; None when
the zygote died before the child and nobody recorded how it ended (no exit file).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
from typing import Any, Optional

from protocol import zygote_wire as wire
from protocol.internal_api import LaunchContext, WarmStart

from . import procfs
from .launcher import LOG_DIR_MARK, LaunchSpec, build_env, signal_group
from protocol.errors import HostError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0          # the zygote's preload (a cold interpreter's import of numpy & co.)
LAUNCH_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 10.0
TITLE_ROOM = 1024
ORPHAN_POLL_S = 0.5


class WarmLaunchError(HostError, RuntimeError):
    """The zygote could not fork the container (the caller launches it cold instead)."""


class WarmProcess:
    """A container process forked by the zygote (see the module doc)."""

    def __init__(self, pid: int, exited: "asyncio.Future[int]", exit_file: str) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None
        self._exited = exited
        self._exit_file = exit_file
        self._orphaned = False      # its zygote died first: `returncode` is what its exit file said
        st = procfs.read_stat(pid)
        self._start_time = st.start_time if st else None

    async def wait(self) -> Optional[int]:
        """The return code; None when it is unknown (the zygote died before the child, and so
        nobody wrote the child's exit file)."""
        if self.returncode is not None or self._orphaned:
            return self.returncode
        try:
            self.returncode = await asyncio.shield(self._exited)
        except WarmLaunchError:
            # The zygote died before its child: the child's status is lost with it. Wait for the
            # child itself, then take the exit code its own exit file has, if the zygote wrote one.
            while self._start_time is not None and procfs.is_same_process(self.pid, self._start_time):  # noqa: ASYNC110
                await asyncio.sleep(ORPHAN_POLL_S)
            self._orphaned = True
            self.returncode = _returncode_from_exit_file(self._exit_file)
        return self.returncode


def _returncode_from_exit_file(path: str) -> Optional[int]:
    """The return code an exit file records (a signal N as -N); None without one: a guess --
    failure or success -- would misreport the container."""
    try:
        with open(path) as f:
            code = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return -(code - 128) if code > 128 else code


def warm_request(spec: LaunchSpec, ctx: LaunchContext, warm: WarmStart) -> wire.WarmLaunch:
    """The zygote's launch request for a container the cold path would run as `spec` and `ctx`:
    the same environment, dirs, log files, exit file and cgroups."""
    return wire.WarmLaunch(
        request_id=0, container_id=spec.container_id, module=warm.module,
        argv=[a.replace(LOG_DIR_MARK, spec.log_dir) for a in warm.argv], env=build_env(spec, ctx),
        cwd=spec.work_dir, stdout=os.path.join(spec.log_dir, "stdout"), stderr=os.path.join(spec.log_dir, "stderr"),
        exit_file=spec.exit_file, cgroup_procs=list(spec.cgroup_join_files))


class WarmLauncher:
    """The NM's zygote: started with the NM, stopped after its containers (see the module doc)."""

    def __init__(self, modules: list[str], python: str = sys.executable) -> None:
        self.modules = list(modules)
        self.python = python
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._reader_task: Optional[asyncio.Task[None]] = None
        self._launches: dict[int, asyncio.Future[tuple[int, asyncio.Future[int]]]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._children: set[int] = set()      # forked and not reported ended (kept past a channel failure)
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self.preload_s: Optional[float] = None   # set when the zygote says it imported its modules

    @property
    def alive(self) -> bool:
        return self._writer is not None and self._reader_task is not None and not self._reader_task.done()

    @property
    def pid(self) -> Optional[int]:
        """The zygote's pid (None before it started)."""
        return self._proc.pid if self._proc is not None else None

    async def wait_channel_closed(self) -> None:
        """Until the channel to the zygote is gone (it exited, or `close`)."""
        if self._reader_task is not None:
            await asyncio.shield(self._reader_task)

    @property
    def ready(self) -> bool:
        """Whether the zygote has imported its modules (a launch before that waits for it)."""
        return self.alive and self.preload_s is not None

    def serves(self, module: str) -> bool:
        return self.alive and module in self.modules

    async def start(self) -> None:
        """Start the zygote; it serves once it has imported its modules (in the background: a
        launch before that waits on the channel like any other)."""
        if not self.modules:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        args = [self.python, "-m", "nodemanager.zygote", "--fd", str(theirs.fileno())]
        for m in self.modules:
            args += ["--preload", m]
        args += ["--title-room", "." * TITLE_ROOM]     # where a child shows which container it is
        # Its own output (a failed preload's traceback) goes to the NM's log.
        self._proc = subprocess.Popen(args, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader), name="zygote-reader")
        log.info("executor zygote pid %d preloading %s", self._proc.pid, ", ".join(self.modules))

    async def launch(self, req: wire.WarmLaunch) -> WarmProcess:
        """Fork the container `req` describes (or hand it to the spare `req.spare_pid`, which
        `spare` started); WarmLaunchError when the zygote cannot."""
        pid, exited = await self._request(req, req.container_id)
        return WarmProcess(pid, exited, req.exit_file)

    async def spare(self, cgroup_procs: list[str]) -> tuple[int, "asyncio.Future[int]"]:
        """Fork a spare child that joins `cgroup_procs` and waits for a launch naming it; its pid
        and its exit (the wait status's code) once it has joined. WarmLaunchError if it could not."""
        return await self._request(wire.WarmSpare(request_id=0, cgroup_procs=list(cgroup_procs)), "a spare")

    async def _request(self, req: wire.WarmLaunch | wire.WarmSpare, what: str
                       ) -> tuple[int, "asyncio.Future[int]"]:
        if not self.alive or self._writer is None:
            raise WarmLaunchError("the executor zygote is not running")
        loop = asyncio.get_running_loop()
        req.request_id = next(self._ids)
        started: asyncio.Future[tuple[int, asyncio.Future[int]]] = loop.create_future()
        self._launches[req.request_id] = started
        try:
            async with self._lock:
                self._writer.write(wire.frame(req))
                await self._writer.drain()
            async with asyncio.timeout(START_TIMEOUT_S + LAUNCH_TIMEOUT_S):
                return await asyncio.shield(started)
        except (OSError, asyncio.TimeoutError) as e:
            raise WarmLaunchError(f"the executor zygote did not start {what}: {e}") from None
        finally:
            self._launches.pop(req.request_id, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                header = await reader.readexactly(wire.HEADER.size)
                msg = wire.decode_reply(await reader.readexactly(wire.body_length(header)))
                if isinstance(msg, wire.WarmStarted):
                    # A spare's launch keeps the future its start made: one exit per process.
                    exited = self._exits.get(msg.pid)
                    if exited is None:
                        exited = self._exits[msg.pid] = loop.create_future()
                    self._children.add(msg.pid)
                    fut = self._launches.get(msg.request_id)
                    if fut is not None and not fut.done():
                        fut.set_result((msg.pid, exited))
                    else:
                        # Nobody waits for it: its request timed out (the NM started that container
                        # cold instead) or was given up. It would run a second copy: end it.
                        log.warning("executor zygote started pid %d for request %d after it was given up; "
                                    "killing it", msg.pid, msg.request_id)
                        signal_group(msg.pid, signal.SIGKILL)
                elif isinstance(msg, wire.WarmReady):
                    self.preload_s = msg.preload_s
                    log.info("executor zygote pid %s ready (preloaded in %.2f s)", self.pid, msg.preload_s)
                elif isinstance(msg, wire.WarmFailed):
                    fut = self._launches.get(msg.request_id)
                    if fut is not None and not fut.done():
                        fut.set_exception(WarmLaunchError(msg.error))
                else:
                    self._children.discard(msg.pid)
                    ended = self._exits.pop(msg.pid, None)
                    if ended is not None and not ended.done():
                        ended.set_result(os.waitstatus_to_exitcode(msg.status))
        except (asyncio.IncompleteReadError, ConnectionError, wire.FrameError) as e:
            if not isinstance(e, asyncio.IncompleteReadError) or e.partial:
                log.warning("executor zygote channel failed: %s", e)
        finally:
            self._writer = None
            gone = WarmLaunchError("the executor zygote exited")
            pending_futures: list[asyncio.Future[Any]] = [*self._launches.values(), *self._exits.values()]
            for pending in pending_futures:
                if not pending.done():
                    pending.set_exception(gone)
                    pending.exception()      # retrieved: a WarmProcess falls back on its own
            self._exits.clear()
            if self._proc is not None and self._proc.poll() is not None:
                log.warning("executor zygote exited with %s", self._proc.returncode)

    async def close(self) -> None:
        """No more warm launches; the zygote exits once its last child is reaped (the NM has
        stopped its containers first). Killed if it does not within CLOSE_TIMEOUT_S."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        proc = self._proc
        if proc is not None:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await asyncio.to_thread(proc.wait)
            except asyncio.TimeoutError:
                log.warning("executor zygote pid %d still running after %.0fs: killing it and %d container "
                            "process(es) left", proc.pid, CLOSE_TIMEOUT_S, len(self._children))
                for pid in list(self._children):    # each child leads its own process group
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                proc.send_signal(signal.SIGKILL)
                await asyncio.to_thread(proc.wait)
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)


__all__ = ["WarmLaunchError", "WarmLauncher", "WarmProcess", "warm_request"]
