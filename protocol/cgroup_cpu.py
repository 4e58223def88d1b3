"""The CPU a cgroup root allows: what a process that sees it can use (shared by the NM, which sizes
its arbiter's CPU pool by it, and the executors, which size their BLAS thread pools by it)."""
from __future__ import annotations

from pathlib import Path


def cgroup_root_cores(root: str = "/sys/fs/cgroup") -> float | None:
    """The cores the cgroup root this process sees allows (quota / period), None when unlimited or
    unreadable. On a testbed host the root is the host's budget (docs/testbed.md)."""
    r = Path(root)
    try:
        quota, period = (r / "cpu.max").read_text().split()[:2]           # v2: "max 100000" / "45000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for d in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            q = int((r / d / "cpu.cfs_quota_us").read_text())
            p = int((r / d / "cpu.cfs_period_us").read_text())
            return None if q <= 0 else q / p
        except (OSError, ValueError):
            continue
    return None
