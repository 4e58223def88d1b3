"""cgroup v1: a container's CPU quota never exceeds one its NM's own cgroup root imposes (the
kernel refuses it with EINVAL), e.g. on a host that is itself a CPU-limited cgroup."""
from __future__ import annotations

from pathlib import Path

from nodemanager.cgroup_v1 import inherited_quota_us


def _cg(d: Path, quota: int, period: int = 100000) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (d / "cpu.cfs_period_us").write_text(f"{period}\n")
    return d


def test_the_tightest_quota_between_the_root_and_the_node_dir_counts(tmp_path: Path) -> None:
    root = _cg(tmp_path / "cpu", 50000)                 # the host's budget: half a core
    _cg(root / "elastane", -1)
    node = _cg(root / "elastane" / "n1", -1)
    assert inherited_quota_us(str(root), str(node), 100000) == 50000
    # Another period is scaled to ours; a tighter level below the root wins.
    _cg(root, 25000, 50000)
    assert inherited_quota_us(str(root), str(node), 100000) == 50000
    _cg(root / "elastane", 30000)
    assert inherited_quota_us(str(root), str(node), 100000) == 30000


def test_no_quota_anywhere_or_above_the_mount_means_no_ceiling(tmp_path: Path) -> None:
    _cg(tmp_path, 10000)                                # above the mount point: not this NM's hierarchy
    root = _cg(tmp_path / "cpu", -1)
    node = _cg(root / "elastane" / "n1", -1)
    assert inherited_quota_us(str(root), str(node), 100000) is None
