"""Memory enforcement without cgroups: sample each container's process-tree RSS, flag the ones over.

The decision is a pure function of a /proc snapshot; the container manager runs it every
`monitor_interval_ms` and kills what it returns.
"""
from __future__ import annotations

from dataclasses import dataclass

from .procfs import ProcStat, tree_rss_bytes

MB = 1024 * 1024


@dataclass(frozen=True)
class Watched:
    """A running container the monitor checks."""

    container_id: str
    pid: int
    limit_mb: int


@dataclass(frozen=True)
class Overrun:
    """A container found past its memory limit."""

    container_id: str
    pid: int
    rss_bytes: int
    limit_mb: int

    def diagnostics(self) -> str:
        """YARN's wording for a container killed for exceeding its physical memory."""
        return (f"Container [pid={self.pid},containerID={self.container_id}] is running beyond physical "
                f"memory limits. Current usage: {_human(self.rss_bytes)} of {_human(self.limit_mb * MB)} "
                f"physical memory used. Killing container.")


def _human(n: int) -> str:
    if n >= 1024 * MB:
        return f"{n / (1024 * MB):.1f} GB"
    return f"{n / MB:.1f} MB"


def find_overruns(watched: list[Watched], stats: list[ProcStat]) -> list[Overrun]:
    """Containers whose process tree's RSS is above their limit in this snapshot."""
    out = []
    for w in watched:
        if w.limit_mb <= 0:
            continue
        rss = tree_rss_bytes(w.pid, stats)
        if rss > w.limit_mb * MB:
            out.append(Overrun(w.container_id, w.pid, rss, w.limit_mb))
    return out


def cgroup_oom_diagnostics(container_id: str, pid: int, limit_mb: int, peak_bytes: int) -> str:
    """YARN-style diagnostics for a container the kernel OOM-killed inside its cgroup."""
    usage = _human(peak_bytes) if peak_bytes > 0 else "limit reached"
    return (f"Container [pid={pid},containerID={container_id}] is running beyond physical memory limits. "
            f"Current usage: {usage} of {_human(limit_mb * MB)} physical memory used. "
            f"The kernel OOM killer killed the container in its cgroup.")
