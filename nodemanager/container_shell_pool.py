"""Pre-started container shells: the cgroup join taken off the container launch path.

A cold launch starts the wrapper script, which moves itself into the container's cgroups before it
runs the command. Moving a process into a cgroup takes the kernel's cgroup threadgroup lock for
writing, which waits for an RCU grace period unless another move happened just before: measured on
the NM's launch path here (cgroup v1), the first join of a launch took 15-20 ms of the ~22 ms from
the AM's allocation to the command running, against 2 ms for a plain fork+exec of the command
(bench/container_launch.py). The pool pays that wait ahead of time: it keeps a few bash processes,
each in a session of its own and already inside a cgroup of its own (made without limits), waiting
on a pipe. A launch takes one, gives its cgroup the container's limits (v1 also renames it to the
container id; v2 cannot rename a cgroup, so there it keeps its `shell-N` name and the container's
record names the dir), writes the launch script and sends its path down the pipe; the shell runs it
in the same process, so the container's pid, process group and session are the shell's.

The shell first sources the container's environment from the pipe (`export` lines; it started with
an empty environment, so they are the whole of it; never written to a file, as it holds the job's
secret), then runs the launch script (`launcher.shell_script`): what Popen does for a cold launch --
the working dir, stdin from /dev/null and the log files -- then what the wrapper does after
joining: run the command, record its exit code. A container whose environment a shell cannot export as it is
(a name that is not a shell identifier) and any launch the pool has no ready shell for take the
cold path, unchanged. Refilling, stale cgroups and closing are nodemanager.prejoined_pool's, shared
with the executor zygote's spares (nodemanager.warm_spares).
"""
from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import subprocess
import time

from protocol.internal_api import LaunchContext

from . import launcher
from .cgroup_base import ContainerCgroup
from .prejoined_pool import PrejoinedPool
from protocol.errors import HostError

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 10.0     # a join waits for at most a grace period or two; far more is a broken host
NAME_PREFIX = "shell-"
READY_LINE = b"ready\n"


class ShellLaunchError(HostError, RuntimeError):
    """A shell could not take this container (the caller launches it cold instead)."""


class ContainerShell:
    """One pre-started shell: a bash process in its own session, inside `cgroup`, waiting on stdin."""

    def __init__(self, popen: subprocess.Popen, cgroup: ContainerCgroup) -> None:
        self.popen = popen
        self.cgroup = cgroup

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def run(self, spec: launcher.LaunchSpec, ctx: LaunchContext) -> launcher.ContainerProcess:
        """Write the container's launch script and hand it to the shell (blocking: a worker thread).
        The shell's cgroup must already carry the container's limits."""
        env = launcher.build_env(spec, ctx)
        if not launcher.shell_can_set(env):
            raise ShellLaunchError("the container's environment has names a shell cannot export")
        script = launcher.write_launch_script(spec.work_dir, launcher.shell_script(spec, launcher.build_command(spec, ctx)))
        stdin = self.popen.stdin
        assert stdin is not None
        try:       # the environment goes down the pipe only: it holds the job's secret
            stdin.write(script.encode() + b"\n" + launcher.shell_exports(env).encode())
            stdin.close()
        except (BrokenPipeError, ValueError, OSError) as e:
            raise ShellLaunchError(f"shell {self.pid} is gone: {e}") from None
        return launcher.ContainerProcess(self.popen)

    def kill(self) -> None:
        """End an unused shell (blocking: it reaps it)."""
        launcher.signal_group(self.pid, signal.SIGKILL)
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self.popen.wait()


class ContainerShellPool(PrejoinedPool[ContainerShell]):
    """Keeps up to `size` ready shells for a node's container manager; refills in the background
    (nodemanager.prejoined_pool)."""

    prefix = NAME_PREFIX
    broken_message = "no pre-started container shells (containers join their cgroups at launch)"

    def discard(self, shell: ContainerShell) -> None:
        """A taken shell the launch could not use (blocking): end it and remove its cgroup."""
        shell.kill()
        if not self.backend.try_remove(shell.cgroup):
            log.warning("could not remove shell cgroup %s (processes remain: %s)",
                        shell.cgroup.dirs, self.backend.pids(shell.cgroup))

    async def _end(self, shell: ContainerShell) -> None:
        await asyncio.to_thread(self.discard, shell)

    async def _start_one(self, cgroup_name: str) -> ContainerShell:
        return await asyncio.to_thread(self._start_shell, cgroup_name)

    def _start_shell(self, cgroup_name: str) -> ContainerShell:
        """Make a cgroup, start a shell that joins it, wait until it has (blocking)."""
        cg = self.backend.make(cgroup_name)
        try:
            popen = subprocess.Popen(
                ["/bin/bash", "-c", launcher.SHELL_STUB, "elastane-shell", *self.backend.join_files(cg)],
                env={}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True, cwd="/")
        except OSError:
            self.backend.try_remove(cg)
            raise
        shell = ContainerShell(popen, cg)
        line = _read_line(popen, READY_TIMEOUT_S)
        if line != READY_LINE:
            self.discard(shell)
            raise ShellLaunchError(f"a shell did not join its cgroup {cg.dirs} (said {line!r}, "
                                   f"exit {popen.returncode})")
        assert popen.stdout is not None
        popen.stdout.close()        # the launch script sends stdout to the log files
        return shell


def _read_line(popen: subprocess.Popen, timeout_s: float) -> bytes:
    """The shell's first line, or what it said before exiting or the timeout (b"")."""
    assert popen.stdout is not None
    fd = popen.stdout.fileno()
    got = b""
    deadline = time.monotonic() + timeout_s
    while not got.endswith(b"\n") and len(got) < 64:
        r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            return got
        chunk = os.read(fd, 64 - len(got))
        if not chunk:
            return got
        got += chunk
    return got
