"""Processes known by pid alone: identity by start time, liveness, signals, waiting.

A cluster started by one process is stopped by another (`elastane cluster stop --dir D`), so the
harness cannot rely on Popen objects. A pid is only trusted together with the start time the
kernel gave it (/proc/<pid>/stat field 22), so a recycled pid is never signalled.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Callable, Iterable, Optional, Union

Clock = Callable[[], float]


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # field 22 overall: starttime
    except (IndexError, ValueError):
        return None


def proc_state(pid: int) -> str | None:
    """The one-letter state of the process (R, S, Z, ...), or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0] if fields else None


def proc_pgid(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return int(fields[2])
    except (IndexError, ValueError):
        return None


def boot_time() -> float:
    """Unix time of the last boot, to turn start ticks into wall-clock time."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def ticks_to_unix(ticks: int) -> float:
    return boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def is_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True if `pid` runs (a zombie counts as dead) and, when given, started at `start_ticks`."""
    state = proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return start_ticks is None or proc_start_ticks(pid) == start_ticks


def signal_pid(pid: int, sig: int, start_ticks: int | None = None) -> bool:
    """Send `sig` to `pid` if it is still the same process; True if it was sent."""
    if not is_alive(pid, start_ticks):
        return False
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):     # gone, or another user's: not ours to end
        return False


def wait_gone(pids: Iterable[tuple[int, int | None]], timeout_s: float,
              clock: Clock = time.monotonic, interval_s: float = 0.05) -> list[int]:
    """Poll until every (pid, start_ticks) is gone or the deadline passes; return the survivors."""
    pending = list(pids)
    deadline = clock() + timeout_s
    while True:
        pending = [(p, t) for p, t in pending if is_alive(p, t)]
        if not pending or clock() >= deadline:
            return [p for p, _ in pending]
        time.sleep(interval_s)


def terminate_all(pids: list[tuple[int, int | None]], timeout_s: float) -> list[int]:
    """SIGTERM each process, wait up to `timeout_s`, SIGKILL the stragglers; return those killed."""
    for pid, ticks in pids:
        signal_pid(pid, signal.SIGTERM, ticks)
    survivors = set(wait_gone(pids, timeout_s))
    stragglers = [(p, t) for p, t in pids if p in survivors]
    for pid, ticks in stragglers:
        signal_pid(pid, signal.SIGKILL, ticks)
    wait_gone(stragglers, 5.0)
    return [p for p, _ in stragglers]


def tail(path: Path, max_lines: int = 30) -> str:
    """The last lines of a log file, for error messages ('' if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-max_lines:])


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def group_members(pgid: int) -> list[int]:
    """Every live process whose process group is `pgid`."""
    return [p for p in _all_pids() if proc_pgid(p) == pgid and is_alive(p)]


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


SignalHandler = Union[Callable[[int, Optional[FrameType]], object], int, None]


def _exit_on_signal(signum: int, frame: Optional[FrameType]) -> None:
    raise SystemExit(128 + signum)


def unwind_on_sigterm() -> SignalHandler:
    """From now on SIGTERM raises SystemExit(143) in the main thread (through `asyncio.run` too),
    so the `finally` that stops what a command or benchmark started runs; returns the previous
    handler (for `signal.signal`)."""
    return signal.signal(signal.SIGTERM, _exit_on_signal)
