"""Launching a container's process: directories, environment, the wrapper script, the spawn.

The wrapper (`launch_container.sh` in the working dir, as YARN names it) first moves itself into
the container's cgroups, so nothing the user's command allocates escapes them, then runs the
commands and writes their exit code to a file, which is how an NM that restarted learns how an
adopted container ended.
"""
from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from protocol import container_env as cenv, storage_settings
from protocol.zygote_wire import CGROUP_JOIN_FAILED_EXIT
from protocol.internal_api import LaunchContext
from protocol.local_resources import LAUNCH_SCRIPT

LOG_DIR_MARK = "<LOG_DIR>"
INHERITED_ENV = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM", "PYTHONPATH",
                 "ELASTANE_LOG_LEVEL", "ELASTANE_CONF_DIR")
# The wrapper could not join the container's cgroup; a pre-started shell (which joined it before)
# exits with it too when it cannot set the container up (working dir, environment, log files).
JOIN_FAILED_EXIT = CGROUP_JOIN_FAILED_EXIT


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one container's process."""

    container_id: str
    app_id: str
    attempt_id: str
    user: str
    memory_mb: int
    vcores: int
    work_dir: str
    log_dir: str
    exit_file: str
    nm_host: str
    nm_port: int
    cgroup_join_files: tuple[str, ...] = ()
    network_bandwidth_bps: int = 0   # > 0: the emulated bandwidth cap, told to the container's data plane
    arbiter_socket: str = ""         # the node's Harmony arbiter (told to Harmony jobs' containers only)


def python_bin_dir() -> str:
    """The NM's Python environment's bin/ (so `python` in a container is the NM's venv python)."""
    return os.path.dirname(sys.executable)


def build_env(spec: LaunchSpec, ctx: LaunchContext) -> dict[str, str]:
    """Inherited basics and the object store's settings (protocol.storage_settings), then the
    launch context's environment, then the names the NM owns."""
    env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    env.update(storage_settings.forwarded())    # the object store's endpoint and credentials
    env.update({k: v.replace(LOG_DIR_MARK, spec.log_dir) for k, v in ctx.environment.items()})
    path = env.get("PATH") or os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PATH"] = python_bin_dir() + os.pathsep + path
    env.update({
        cenv.CONTAINER_ID: spec.container_id,
        cenv.NM_HOST: spec.nm_host,
        cenv.NM_PORT: str(spec.nm_port),
        cenv.NM_HTTP_ADDRESS: f"{spec.nm_host}:{spec.nm_port}",
        cenv.APP_ID: spec.app_id,
        cenv.USER: spec.user,
        cenv.LOG_DIRS: spec.log_dir,
        cenv.PWD: spec.work_dir,
        cenv.CONTAINER_MEMORY_MB: str(spec.memory_mb),
        cenv.CONTAINER_VCORES: str(spec.vcores),
    })
    if spec.network_bandwidth_bps > 0:
        env[cenv.NODE_BANDWIDTH_BPS] = str(spec.network_bandwidth_bps)
    if spec.arbiter_socket and env.get(cenv.HARMONY) == "1":
        env[cenv.ARBITER_SOCKET] = spec.arbiter_socket
    if spec.attempt_id:
        env.setdefault(cenv.APP_ATTEMPT_ID, spec.attempt_id)
    return env


def build_command(spec: LaunchSpec, ctx: LaunchContext) -> str:
    """The user's commands joined with " && ", with <LOG_DIR> replaced (YARN's convention)."""
    return " && ".join(c.replace(LOG_DIR_MARK, spec.log_dir) for c in ctx.commands)


def wrapper_script(spec: LaunchSpec, command: str) -> str:
    """The bash script that joins the cgroups, runs `command` and records its exit code."""
    q = shlex.quote
    lines = ["#!/bin/bash", f"# Elastane NM launch script for {spec.container_id}"]
    for f in spec.cgroup_join_files:
        lines.append(f"echo $$ > {q(f)} || {{ echo 'elastane: cannot join cgroup {f}' >&2; "
                     f"exit {JOIN_FAILED_EXIT}; }}")
    return "\n".join(lines + _run_and_record(spec, command))


def _run_and_record(spec: LaunchSpec, command: str) -> list[str]:
    q = shlex.quote
    return [
        # In a subshell of this script (a fork, no second bash exec): `eval` keeps a syntax error in
        # the command the command's own failure (exit 2, recorded) instead of the wrapper's.
        f"( eval {q(command)} )",
        "rc=$?",
        # Written in place, not to a temp file renamed with mv (a fork+exec of /bin/mv in every
        # container): the NM reads it only once this process is gone (its exit, or recovery after
        # a restart finding the pid gone), so nobody reads it half-written.
        f"echo $rc > {q(spec.exit_file)}",
        "exit $rc",
        "",
    ]


# What a pre-started container shell runs (nodemanager.container_shell_pool): it joins the cgroups
# named by its arguments and says so on stdout; then it reads from the pipe the path of its launch
# script and the container's environment (`export` lines, never written to a file: it holds the
# job's secret), and runs the script in this same process. A pipe closed first (the NM went away)
# ends it.
SHELL_STUB = ('for f in "$@"; do echo $$ > "$f" || exit %d; done; echo ready; read -r s || exit 0; '
              '. /dev/stdin || exit %d; . "$s"' % (JOIN_FAILED_EXIT, JOIN_FAILED_EXIT))
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def shell_can_set(env: dict[str, str]) -> bool:
    """Whether a shell can export this environment as it is (names a shell accepts, no NUL)."""
    return all(_ENV_NAME.match(k) and "\0" not in v for k, v in env.items())


def shell_exports(env: dict[str, str]) -> str:
    """`env` as the export lines a pre-started shell sources from its pipe. The shell started with
    an empty environment, so these are the whole of what the container's processes inherit."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def shell_script(spec: LaunchSpec, command: str) -> str:
    """The launch script a pre-started shell runs once its environment is set: first what Popen does
    for a cold launch (the working dir, stdin and the log files), then what the wrapper does once in
    the cgroups."""
    q = shlex.quote
    lines = ["#!/bin/bash", f"# Elastane NM launch script for {spec.container_id} (a pre-started shell)",
             f"cd -- {q(spec.work_dir)} || exit {JOIN_FAILED_EXIT}",
             "unset OLDPWD",
             f"exec </dev/null >>{q(os.path.join(spec.log_dir, 'stdout'))} "
             f"2>>{q(os.path.join(spec.log_dir, 'stderr'))} || exit {JOIN_FAILED_EXIT}"]
    return "\n".join(lines + _run_and_record(spec, command))


def prepare_dirs(spec: LaunchSpec) -> None:
    """Create the working and log dirs (the "localization" step)."""
    Path(spec.work_dir).mkdir(parents=True, exist_ok=True)
    Path(spec.log_dir).mkdir(parents=True, exist_ok=True)
    try:
        os.unlink(spec.exit_file)
    except FileNotFoundError:
        pass


class ContainerProcess:
    """A spawned container process whose exit is awaited through a pidfd on the event loop.

    Spawned with subprocess.Popen (vfork/posix_spawn) rather than asyncio's subprocess API: under
    uvloop the latter forks the whole NM and blocks the loop for several ms per launch, which
    queues concurrent launches behind each other.
    """

    def __init__(self, popen: subprocess.Popen):
        self._popen = popen
        self.pid = popen.pid
        self.returncode: Optional[int] = None

    async def wait(self) -> int:
        if self.returncode is not None:
            return self.returncode
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            fd = -1
        if fd >= 0:
            done: asyncio.Future[None] = loop.create_future()

            def readable() -> None:
                if not done.done():
                    done.set_result(None)

            loop.add_reader(fd, readable)
            try:
                await done
            finally:
                loop.remove_reader(fd)
                os.close(fd)
            self.returncode = self._popen.wait()
        else:  # kernels without pidfd: poll
            while self._popen.poll() is None:  # noqa: ASYNC110 (another process: nothing to await)
                await asyncio.sleep(0.05)
            self.returncode = self._popen.returncode
        return self.returncode


def write_launch_script(work_dir: str, text: str) -> str:
    """Write the container's launch script into its working dir (0700) and return its path. Never
    through a link: whatever is there under that name goes first, and the file is created anew
    (O_EXCL | O_NOFOLLOW), so a link planted there cannot aim the NM's write at another file."""
    path = os.path.join(work_dir, LAUNCH_SCRIPT)
    try:
        os.unlink(path)         # a link is removed, not followed
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def spawn(spec: LaunchSpec, ctx: LaunchContext) -> ContainerProcess:
    """Write the wrapper and start it in its own session (process group = its pid). Blocking:
    the NM calls it from a worker thread."""
    script = write_launch_script(spec.work_dir, wrapper_script(spec, build_command(spec, ctx)))
    out = open(os.path.join(spec.log_dir, "stdout"), "ab")
    err = open(os.path.join(spec.log_dir, "stderr"), "ab")
    try:
        popen = subprocess.Popen(["/bin/bash", script], cwd=spec.work_dir, env=build_env(spec, ctx),
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                 close_fds=True)
        return ContainerProcess(popen)
    finally:
        out.close()
        err.close()


def exit_code_from_returncode(returncode: int) -> int:
    """A process's exit status as a shell reports it: death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Signal a process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
