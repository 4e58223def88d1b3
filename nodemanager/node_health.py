"""The node's health as the NM reports it in every heartbeat (YARN's NodeHealthCheckerService).

Two checks, as YARN's NodeManager makes them:

- **The disks** (YARN's LocalDirsHandlerService): each filesystem holding the NM's `local_dir`,
  `log_dir` or `recovery_dir` must be less than `max_disk_utilization_percent` full (YARN's
  `disk-health-checker.max-disk-utilization-per-disk-percentage`, 90) and keep at least
  `min_free_disk_mb` free (`min-free-space-per-disk-mb`, 0). A node whose container dirs or logs
  cannot be written fails every container it starts.
- **The operator's health script** (`health-checker.script.path`): run every
  `health_check_interval_s`, at most `health_script_timeout_s`. A line of its standard output that
  starts with `ERROR` makes the node unhealthy, that output being the report. As in YARN, a script
  that exits non-zero, times out (it is killed, with its process group) or cannot be run does not
  make the node unhealthy: a broken script must not take a cluster's nodes out; it is logged.

The RM marks a node whose heartbeat says unhealthy UNHEALTHY and places nothing on it until one
says healthy again (rm/nodes.py); the containers it runs go on.

`disk_problems`, `script_problem` and `health` are pure; `NodeHealthMonitor` measures and runs the
script, and keeps the latest verdict for the heartbeats (nodemanager/rm_link.py).
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from typing import NamedTuple, Optional, Sequence

from protocol.internal_api import NodeHealth

log = logging.getLogger(__name__)

HEALTHY = NodeHealth(healthy=True, report="")
REPORT_CHARS = 1000             # of the script's output kept in the report


class DiskUsage(NamedTuple):
    """One filesystem the NM writes to: the dirs on it, its size and what is free (bytes)."""

    paths: tuple[str, ...]
    total: int
    free: int


def disk_problems(disks: Sequence[DiskUsage], max_utilization_percent: float, min_free_mb: int) -> list[str]:
    """What is wrong with the disks, one line each ([] when nothing)."""
    out = []
    for d in disks:
        where = ", ".join(d.paths)
        if d.total <= 0:
            out.append(f"{where}: the filesystem reports no size")
            continue
        used = 100.0 * (d.total - d.free) / d.total
        if used >= max_utilization_percent:
            out.append(f"{where}: {used:.1f}% full (max_disk_utilization_percent {max_utilization_percent:g})")
        elif d.free < min_free_mb * 2**20:
            out.append(f"{where}: {d.free // 2**20} MB free (min_free_disk_mb {min_free_mb})")
    return out


def script_problem(output: str) -> Optional[str]:
    """The script's verdict: its output when a line of it starts with ERROR, else None (healthy)."""
    if any(line.startswith("ERROR") for line in output.splitlines()):
        return output.strip()[:REPORT_CHARS]
    return None


def health(disks: Sequence[str], script: Optional[str]) -> NodeHealth:
    """The heartbeat's NodeHealth from the disks' problems and the script's verdict."""
    lines = ([f"local dirs are bad: {'; '.join(disks)}"] if disks else []) + (
        [f"health script: {script}"] if script else [])
    return NodeHealth(healthy=not lines, report="\n".join(lines))


def measure(paths: Sequence[str]) -> list[DiskUsage]:
    """The filesystems under `paths` (each measured once, the dirs on it named); a dir that does
    not exist yet is measured at its nearest existing parent."""
    by_dev: dict[int, tuple[list[str], str]] = {}
    for p in paths:
        probe = p
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        dev = os.stat(probe).st_dev
        by_dev.setdefault(dev, ([], probe))[0].append(p)
    out = []
    for names, probe in by_dev.values():
        u = shutil.disk_usage(probe)
        out.append(DiskUsage(tuple(names), u.total, u.free))
    return out


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Kill the script and what it started (it leads its own session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    await proc.wait()


class NodeHealthMonitor:
    """Checks the disks and runs the health script every `interval_s`; `current` is the latest
    verdict (healthy until the first check says otherwise)."""

    def __init__(self, paths: Sequence[str], max_utilization_percent: float, min_free_mb: int,
                 script: str = "", script_timeout_s: float = 60.0, interval_s: float = 60.0) -> None:
        self.paths = list(paths)
        self.max_utilization_percent = max_utilization_percent
        self.min_free_mb = min_free_mb
        self.script = script
        self.script_timeout_s = script_timeout_s
        self.interval_s = interval_s
        self.current = HEALTHY
        self._task: Optional[asyncio.Task[None]] = None

    async def check(self) -> NodeHealth:
        """One check of both; `current` is set to its verdict (a change is logged)."""
        disks = await asyncio.to_thread(measure, self.paths)
        verdict = health(disk_problems(disks, self.max_utilization_percent, self.min_free_mb),
                         await self._run_script() if self.script else None)
        if verdict != self.current:
            if verdict.healthy:
                log.warning("node healthy again")
            else:
                log.warning("node unhealthy: %s", verdict.report)
        self.current = verdict
        return verdict

    async def _run_script(self) -> Optional[str]:
        try:
            proc = await asyncio.create_subprocess_exec(self.script, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                                                        start_new_session=True)
        except OSError as e:
            log.warning("health script %s could not be run (the node is not marked unhealthy for it): %s",
                        self.script, e)
            return None
        try:
            async with asyncio.timeout(self.script_timeout_s):
                out, _ = await proc.communicate()
        except asyncio.TimeoutError:
            await _end(proc)
            log.warning("health script %s timed out after %g s (the node is not marked unhealthy for it)",
                        self.script, self.script_timeout_s)
            return None
        except asyncio.CancelledError:      # the NM is stopping: the script goes with it
            await _end(proc)
            raise
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            log.warning("health script %s exited with %s (the node is not marked unhealthy for it): %s",
                        self.script, proc.returncode, text.strip()[:REPORT_CHARS])
            return None
        return script_problem(text)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="node-health")

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:      # a check that fails keeps the last verdict; the heartbeats go on
                log.exception("node health check failed")
            await asyncio.sleep(self.interval_s)   # a periodic timer, not a readiness wait

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


__all__ = ["DiskUsage", "HEALTHY", "NodeHealthMonitor", "disk_problems", "health", "measure", "script_problem"]
