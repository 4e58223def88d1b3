"""The CPU a cgroup allows: what a process under it can use (shared by the NM, which sizes its
arbiter's CPU pool by the root's, and the executors, which size their BLAS thread pools by their
own cgroup's).

Every reader takes the cgroup mount as `root` (and a process's membership file as `proc_cgroup`),
so tests can point them at a directory tree of their own.
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath

# Where a v1 cpu hierarchy is mounted under the cgroup root (the first that exists is taken).
V1_CPU_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def v2_cores(d: Path) -> float | None:
    """The quota in cores of the v2 cgroup dir `d` (its cpu.max, "quota period" or "max period"),
    None when unlimited, absent or unreadable."""
    try:
        quota, period = (d / "cpu.max").read_text().split()[:2]           # v2: "max 100000" / "45000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def v1_cores(d: Path) -> float | None:
    """The quota in cores of the v1 cpu cgroup dir `d` (cpu.cfs_quota_us / cpu.cfs_period_us;
    a quota of -1 is none), None when unlimited, absent or unreadable."""
    try:
        q = int((d / "cpu.cfs_quota_us").read_text())
        p = int((d / "cpu.cfs_period_us").read_text())
        return None if q <= 0 or p <= 0 else q / p
    except (OSError, ValueError):
        return None


def _smallest(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def cgroup_root_cores(root: str = "/sys/fs/cgroup") -> float | None:
    """The cores the cgroup root this process sees allows (quota / period), None when unlimited or
    unreadable. On a testbed host the root is the host's budget (docs/testbed.md)."""
    r = Path(root)
    if (cores := v2_cores(r)) is not None:
        return cores
    for d in V1_CPU_DIRS:
        if (cores := v1_cores(r / d)) is not None:
            return cores
    return None


def own_cgroup(proc_cgroup_text: str) -> tuple[str | None, tuple[str, str] | None]:
    """From /proc/<pid>/cgroup: the process's v2 cgroup path ("0::/path") and its v1 cpu one as
    (controllers, path) from the line whose controllers include cpu ("4:cpu,cpuacct:/path");
    None for either that is not there."""
    v2: str | None = None
    v1: tuple[str, str] | None = None
    for line in proc_cgroup_text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = (controllers, path)
    return v2, v1


def _chain(mount: Path, path: str) -> list[Path]:
    """The dirs from the cgroup `path` under `mount` up to `mount` itself (deepest first)."""
    parts = [p for p in PurePosixPath(path).parts if p not in ("/", "", ".", "..")]
    return [mount.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def process_cgroup_cores(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """The cores the process's own cgroup allows: the smallest quota along its path (from
    `proc_cgroup`) up to the root -- v1's cpu hierarchy where the process has one, else v2's --
    and never more than the root's (`cgroup_root_cores`); None when nothing on the way has a quota.

    A container's process sits in a cgroup of its own below the root (the NM's
    <mount>/elastane/<node>/<container>, no cgroup namespace), whose quota the root's cpu.max
    does not show; in a cgroup namespace the path is "/" and this is the root's."""
    r = Path(root)
    try:
        text = Path(proc_cgroup).read_text()
    except OSError:
        text = ""
    v2, v1 = own_cgroup(text)
    found: list[float | None] = [cgroup_root_cores(root)]
    mount = None
    if v1 is not None:
        mount = next((r / d for d in (v1[0], *V1_CPU_DIRS) if (r / d).is_dir()), None)
    if mount is not None and v1 is not None:
        found.extend(v1_cores(d) for d in _chain(mount, v1[1]))
    elif v2 is not None:
        found.extend(v2_cores(d) for d in _chain(r, v2))
    return _smallest(found)
