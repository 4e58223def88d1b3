"""The executor zygote: a pre-started interpreter that forks warm containers for its NodeManager.

    python -m nodemanager.zygote --fd N --preload psruntime.executor

Started by the NM (nodemanager.warm_launcher) with one end of a socketpair as fd N. It imports the
preload modules once (numpy, asyncio, msgspec, the data plane, the store: most of an executor's
start-up; uvloop; and a module's `warm_up()` where it has one), then serves `WarmLaunch` requests
(protocol.zygote_wire): for each it forks a child that
makes itself the container exactly as the cold launch's wrapper script does -- its own session
(process group = its pid), joined to the container's cgroups before it runs anything of the
container, in the container's working dir with exactly the container's environment, stdin from
/dev/null, stdout / stderr appended to the container's log files -- and then runs the module with
the container's argv: the callable its `WARM_ENTRY` names (what its `python -m` runs; the module is
not executed again), or, for a module without one, the module as __main__. Memory the child
allocates is charged to its container's
cgroup; the pages it shares with the zygote (the preloaded modules, copy-on-write) stay charged to
the NM's, as a shared library's would.

The zygote is the children's parent: it reaps each one, writes its exit code to the container's
exit file (atomically, as the wrapper does, so an NM restarted meanwhile still learns it) and
reports the raw wait status to the NM. It is single-threaded (a selector over the socket and the
SIGCHLD wakeup pipe), so a fork never copies another thread's half-done state. When the NM closes
the socket the zygote forks no more and exits once its last child has been reaped.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import os
import runpy
import selectors
import signal
import socket
import sys
import time
import traceback
from typing import Callable, NoReturn, Optional

import msgspec

from protocol import container_env
from protocol.durable_storage import write_atomic
from protocol import zygote_wire as wire

# The container identity a warm child puts in its process title (its /proc environ is the zygote's).
TITLE_ENV = (container_env.CONTAINER_ID, container_env.APP_ID)


def _write_exit_file(path: str, code: int) -> None:
    try:   # atomic, not durable: the NM reads it while this node is up
        write_atomic(path, f"{code}\n".encode(), durable=False)
    except OSError:
        pass        # the NM still gets the status over the socket


def _exit_code(status: int) -> int:
    """A wait status as a shell reports it (death by signal N is 128 + N), for the exit file."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def set_process_title(title: str) -> bool:
    """Show `title` as this process's /proc/PID/cmdline: a forked child keeps the zygote's argv and
    its *initial* environment there, so `ps` and the tools that look for a container's processes
    (by CONTAINER_ID / APPLICATION_ID) would not see which container it is. The kernel shows the
    argv area [arg_start, arg_end) of the process's own memory; the zygote's argv reserved room in
    it (--title-room), and the title is written there, cut to fit."""
    try:
        fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])       # arg_start, arg_end: stat fields 48, 49
    except (OSError, IndexError, ValueError):
        return False
    size = end - start
    if size <= 1:
        return False
    data = title.encode(errors="replace")[:size - 1].ljust(size, b"\0")
    ctypes.memmove(start, data, size)
    return True


def container_title(req: wire.WarmLaunch) -> str:
    """What a warm container shows as its command line: the command it runs, then its identity as
    the cold launch's environment would carry it."""
    ident = " ".join(f"{k}={req.env[k]}" for k in TITLE_ENV if k in req.env)
    return " ".join(["python", "-m", req.module, *req.argv, ident])


def _enter_session_and_cgroups(cgroup_procs: list[str]) -> bool:
    """A new session (process group = pid), then each cgroup joined; False (said on stderr) if one
    could not be."""
    os.setsid()
    for procs in cgroup_procs:
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            os.write(2, f"elastane: cannot join cgroup {procs}: {e}\n".encode())
            return False
    return True


def _become_container(req: wire.WarmLaunch, ready: int) -> int:
    """In the forked child: set up the container's process and run its module; returns the exit
    code. `ready` is closed once the child leads its session and joined its cgroups (the zygote
    waits for that before it reports the start)."""
    try:
        _open_container_stdio(req)      # first: a failed join is said in the container's stderr
        if not _enter_session_and_cgroups(req.cgroup_procs):
            return wire.CGROUP_JOIN_FAILED_EXIT
    finally:
        os.close(ready)
    return _run_container(req)


def _open_container_stdio(req: wire.WarmLaunch) -> None:
    """stdin from /dev/null, stdout / stderr appended to the container's log files."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    out = os.open(req.stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    err = os.open(req.stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd, target in ((devnull, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)


def _become_spare(cgroup_procs: list[str], ready: int, requests: int) -> int:
    """In a spare child: its session and cgroups now, then wait for the container it becomes (a
    WarmLaunch on `requests`, whose end the zygote closes once it wrote it; nothing: exit)."""
    # Only its own pipes: a write end of another spare's pipe held here would keep that spare from
    # ever reading the end of its request.
    _close_fds_except({0, 1, 2, ready, requests})
    try:
        joined = _enter_session_and_cgroups(cgroup_procs)
        if joined:
            os.write(ready, b"j")
    finally:
        os.close(ready)
    if not joined:
        return wire.CGROUP_JOIN_FAILED_EXIT
    chunks = []
    while chunk := os.read(requests, 1 << 16):
        chunks.append(chunk)
    os.close(requests)
    data = b"".join(chunks)
    if not data:
        return 0        # the zygote closed: never used
    req = wire.decode_request(data[wire.HEADER.size:])
    if not isinstance(req, wire.WarmLaunch):
        return 1
    _open_container_stdio(req)
    return _run_container(req)


def _close_fds_except(keep: set[int]) -> None:
    top = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024
    lo = 0
    for fd in [*sorted(keep), top]:
        if lo < fd:      # never an empty range: closerange(n, n) closes every fd from n on (3.11)
            os.closerange(lo, fd)
        lo = fd + 1


def _run_container(req: wire.WarmLaunch) -> int:
    """The container's process, from its session and cgroups on: its dir, environment and module."""
    _close_fds_except({0, 1, 2})
    os.chdir(req.cwd)
    os.environ.clear()
    os.environ.update(req.env)
    if req.env.get("PYTHONUNBUFFERED"):      # read at interpreter start, which was the zygote's
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.argv = [req.module, *req.argv]
    set_process_title(container_title(req))
    preloaded = sys.modules.get(req.module)
    entry = getattr(preloaded, "WARM_ENTRY", None)
    try:
        if callable(entry):
            # The preloaded module's own entry point (what its `python -m` runs): running the
            # module again (runpy) read and executed its code anew in every child, the largest part
            # of a warm start (an EPS add waits on it).
            code = entry()
            return code if isinstance(code, int) else 0
        else:
            runpy.run_module(req.module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - the container's failure, reported as its exit code
        traceback.print_exc()
        return 1
    return 0


class Zygote:
    """Serves warm launches over `sock` (see the module doc)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: dict[int, wire.WarmLaunch] = {}
        # Spare children (WarmSpare): pid -> the write end of the pipe its WarmLaunch goes down;
        # joining: the read end of a spare's ready pipe -> (request id, pid, its request pipe).
        self.spares: dict[int, int] = {}
        self._joining: dict[int, tuple[int, int, int]] = {}
        # Joining spares reaped before their join was read: pid -> wait status. Their WarmExited
        # waits for the join's answer, so the NM hears the start (or failure) first: an exit it
        # heard before the start would leave it holding a dead pid as an idle spare.
        self._exited_joining: dict[int, int] = {}
        self.closing = False
        self._buf = b""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel = selectors.DefaultSelector()

    def serve(self) -> int:
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)      # wakes the selector through the pipe
        signal.signal(signal.SIGTERM, signal.SIG_IGN)       # the NM ends us by closing the socket
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sel = self._sel
        sel.register(self.sock, selectors.EVENT_READ, "sock")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        while not (self.closing and not self.children and not self.spares and not self._joining):
            for key, _ in sel.select():
                if key.data == "wake":
                    self._drain_wakeups()
                    self._reap()
                elif key.data == "joined":
                    self._spare_joined(key.fd)
                elif not self._read():
                    self._close()
            self._reap()            # a SIGCHLD may have come between select and the handler
        return 0

    def _close(self) -> None:
        """The NM closed the channel: fork no more, and let the spares go (each reads the end of
        its pipe and exits)."""
        self.closing = True
        self._sel.unregister(self.sock)
        for w in self.spares.values():
            if w >= 0:
                os.close(w)
        self.spares = {pid: -1 for pid in self.spares}      # reaped as they exit

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _read(self) -> bool:
        try:
            data = self.sock.recv(1 << 16)
        except InterruptedError:
            return True
        except ConnectionResetError:    # the NM closed with our last reports unread: closed all the same
            return False
        if not data:
            return False
        self._buf += data
        while len(self._buf) >= wire.HEADER.size:
            n = wire.body_length(self._buf[:wire.HEADER.size])
            if len(self._buf) < wire.HEADER.size + n:
                break
            frame = self._buf[:wire.HEADER.size + n]
            body, self._buf = frame[wire.HEADER.size:], self._buf[wire.HEADER.size + n:]
            req = wire.decode_request(body)
            if isinstance(req, wire.WarmSpare):
                self._fork_spare(req)
            elif req.spare_pid:
                self._hand_to_spare(req, frame)
            else:
                self._launch(req)
        return True

    def send_ready(self, preload_s: float) -> None:
        """Tell the NM the modules are imported (its node info shows the zygote ready)."""
        self._send(wire.WarmReady(round(preload_s, 3)))

    def _send(self, msg: msgspec.Struct) -> None:
        if self.closing:
            return
        try:
            self.sock.sendall(wire.frame(msg))
        except OSError:
            self.closing = True

    def _fork(self, request_id: int) -> Optional[int]:
        try:
            return os.fork()
        except OSError as e:
            self._send(wire.WarmFailed(request_id, f"fork: {e}"))
            return None

    def _in_child(self, become: Callable[[], int]) -> NoReturn:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            code = become()
        except BaseException:  # noqa: BLE001 - said where the child's stderr goes, then its exit code
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def _launch(self, req: wire.WarmLaunch) -> None:
        ready_r, ready_w = os.pipe()
        pid = self._fork(req.request_id)
        if pid is None:
            os.close(ready_r)
            os.close(ready_w)
            return
        if pid == 0:      # the container
            os.close(ready_r)
            self._in_child(lambda: _become_container(req, ready_w))
        os.close(ready_w)
        # Started only once the child leads its own session and sits in its cgroups (or gave up
        # on them): from then on the NM may signal its process group, and nothing of the
        # container has run outside its limits. As Popen returns only after the child's setsid.
        try:
            os.read(ready_r, 1)
        finally:
            os.close(ready_r)
        self.children[pid] = req
        self._send(wire.WarmStarted(req.request_id, pid))

    def _fork_spare(self, req: wire.WarmSpare) -> None:
        ready_r, ready_w = os.pipe()
        req_r, req_w = os.pipe()
        pid = self._fork(req.request_id)
        if pid is None:
            for fd in (ready_r, ready_w, req_r, req_w):
                os.close(fd)
            return
        if pid == 0:      # the spare
            self._in_child(lambda: _become_spare(req.cgroup_procs, ready_w, req_r))
        os.close(ready_w)
        os.close(req_r)
        # Not waited for here, unlike a launch's join: the join's grace period would hold up the
        # launches behind it. The selector says when the spare has joined (or failed to).
        self._joining[ready_r] = (req.request_id, pid, req_w)
        self._sel.register(ready_r, selectors.EVENT_READ, "joined")

    def _spare_joined(self, ready_r: int) -> None:
        request_id, pid, req_w = self._joining.pop(ready_r)
        self._sel.unregister(ready_r)
        try:
            said = os.read(ready_r, 1)
        finally:
            os.close(ready_r)
        status = self._exited_joining.pop(pid, None)
        if said == b"j" and not self.closing and status is None:
            self.spares[pid] = req_w
            self._send(wire.WarmStarted(request_id, pid))
            return
        os.close(req_w)       # it exits (it could not join, or we are closing); reaped as a spare
        if status is None:
            self.spares[pid] = -1
        elif said == b"j":
            # It joined, then was killed before we read so: a spare that started and ended (the
            # NM's pool skips it and removes its cgroup), not a failed join, which would stop the
            # NM from keeping spares at all.
            self._send(wire.WarmStarted(request_id, pid))
            self._send(wire.WarmExited(pid, status))
            return
        self._send(wire.WarmFailed(request_id, f"the spare {pid} did not join its cgroups"))
        if status is not None:
            self._send(wire.WarmExited(pid, status))

    def _hand_to_spare(self, req: wire.WarmLaunch, frame: bytes) -> None:
        req_w = self.spares.get(req.spare_pid, -1)
        if req_w < 0:
            self._send(wire.WarmFailed(req.request_id, f"no spare {req.spare_pid} is waiting"))
            return
        del self.spares[req.spare_pid]
        try:
            os.write(req_w, frame)        # a launch's frame is far below a pipe's buffer
        except OSError as e:
            self._send(wire.WarmFailed(req.request_id, f"spare {req.spare_pid}: {e}"))
            return
        finally:
            os.close(req_w)
        self.children[req.spare_pid] = req
        self._send(wire.WarmStarted(req.request_id, req.spare_pid))

    def _reap(self) -> None:
        while self.children or self.spares or self._joining:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                self.spares.clear()
                return
            if pid == 0:
                return
            req = self.children.pop(pid, None)
            if req is not None:
                _write_exit_file(req.exit_file, _exit_code(status))
            w = self.spares.pop(pid, -1)
            if w >= 0:
                os.close(w)
            if any(joining == pid for _, joining, _ in self._joining.values()):
                self._exited_joining[pid] = status      # told after its join's answer (_spare_joined)
                continue
            self._send(wire.WarmExited(pid, status))


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nodemanager.zygote", description=__doc__.split("\n")[0])
    p.add_argument("--fd", type=int, required=True, help="the NM's end of the socketpair")
    p.add_argument("--preload", action="append", default=[], help="a module to import before serving")
    p.add_argument("--title-room", default="", help="padding: argv room for the children's process titles")
    ns = p.parse_args(argv)
    sock = socket.socket(fileno=ns.fd)
    started = time.monotonic()
    for module in ns.preload:
        warm_up = getattr(importlib.import_module(module), "warm_up", None)
        if callable(warm_up):       # a module's own once-per-zygote preparation (e.g. psruntime.executor)
            warm_up()
    # The event loop every daemon and executor installs first thing (protocol.daemon.install_uvloop):
    # imported here, not in each child, where it cost a warm start's largest import (an EPS add waits
    # on the new executor's start). Optional, as there.
    try:
        importlib.import_module("uvloop")
    except ImportError:
        pass
    gc.collect()
    gc.freeze()      # the preloaded objects' GC headers are not written in every child (copy-on-write)
    zygote = Zygote(sock)
    zygote.send_ready(time.monotonic() - started)
    return zygote.serve()


if __name__ == "__main__":
    sys.exit(main())
