"""Reading processes from /proc: start times (to tell a pid from its reuse), trees, RSS."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the NM uses."""

    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    utime: int
    stime: int
    start_time: int      # clock ticks after boot; with the pid, identifies a process uniquely
    rss_pages: int


def parse_stat(text: str) -> ProcStat:
    """Parse /proc/<pid>/stat; the command name may contain spaces and parentheses."""
    pid_s, rest = text.split(" (", 1)
    fields = rest[rest.rindex(")") + 2:].split()
    # fields[0] is field 3 (state) of proc(5).
    return ProcStat(pid=int(pid_s), state=fields[0], ppid=int(fields[1]), pgid=int(fields[2]),
                    sid=int(fields[3]), utime=int(fields[11]), stime=int(fields[12]),
                    start_time=int(fields[19]), rss_pages=int(fields[21]))


def read_stat(pid: int, proc_root: str = "/proc") -> Optional[ProcStat]:
    """The stat of `pid`, or None if it does not exist."""
    try:
        with open(f"{proc_root}/{pid}/stat") as f:
            return parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


def is_same_process(pid: int, start_time: int, proc_root: str = "/proc") -> bool:
    """True if `pid` is alive (not a zombie) and is the process that started at `start_time`."""
    st = read_stat(pid, proc_root)
    return st is not None and st.start_time == start_time and st.state != "Z"


ENVIRON_SETTLE_TRIES = 50          # x 2 ms: how long a just-exec'd process's environ may read empty


def environ(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    """The process's initial environment ({} if unreadable or really empty).

    Right after fork+exec /proc/PID/environ can read empty for a few milliseconds (the new image's
    stack is not set up yet); an empty read is retried briefly so that a process that has an
    environment is not mistaken for one without (who kills a container's stragglers decides by
    their CONTAINER_ID: the NM at recovery, the local cluster's reaper)."""
    raw = b""
    for _ in range(ENVIRON_SETTLE_TRIES):
        try:
            with open(f"{proc_root}/{pid}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            return {}
        if raw or not os.path.exists(f"{proc_root}/{pid}"):
            break
        time.sleep(0.002)
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def all_stats(proc_root: str = "/proc") -> list[ProcStat]:
    """A snapshot of every process."""
    out: list[ProcStat] = []
    try:
        names = os.listdir(proc_root)
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            st = read_stat(int(name), proc_root)
            if st is not None:
                out.append(st)
    return out


def tree_pids(root_pid: int, stats: list[ProcStat]) -> set[int]:
    """`root_pid`, its descendants, and every process of its session (a container's process tree)."""
    children: dict[int, list[int]] = {}
    for s in stats:
        children.setdefault(s.ppid, []).append(s.pid)
    found = {s.pid for s in stats if s.sid == root_pid}
    found.add(root_pid)
    stack = list(found)
    while stack:
        p = stack.pop()
        for c in children.get(p, ()):
            if c not in found:
                found.add(c)
                stack.append(c)
    return found


def tree_rss_bytes(root_pid: int, stats: list[ProcStat]) -> int:
    """Total resident memory of a container's process tree."""
    pids = tree_pids(root_pid, stats)
    return sum(s.rss_pages for s in stats if s.pid in pids) * PAGE_SIZE


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
