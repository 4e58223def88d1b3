"""cgroup detection (fake /proc/mounts), v2 on a fake cgroupfs, v1 for real where the machine allows."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from nodemanager.cgroup_base import ContainerCgroup, cpu_quota_us, sanitise
from nodemanager.cgroup_detect import CgroupVersion, detect, parse_mounts
from nodemanager.cgroup_v1 import CgroupV1
from nodemanager.cgroup_v2 import CgroupV2, v2_weight
from nodemanager.enforcement import choose

V1_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
"""


def fake_v2(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def test_parse_mounts_unescapes_and_skips_junk():
    ms = parse_mounts("cgroup /a\\040b cgroup rw,cpu 0 0\nbroken line\n")
    assert len(ms) == 1 and ms[0].mount_point == "/a b" and "cpu" in ms[0].options


def test_detect_v1_with_joint_cpu_cpuacct_mount():
    lay = detect(V1_MOUNTS)
    assert lay.version is CgroupVersion.V1
    assert lay.v1_mounts["cpu"] == "/sys/fs/cgroup/cpu,cpuacct"
    assert lay.v1_mounts["memory"] == "/sys/fs/cgroup/memory"


def test_detect_v2(tmp_path):
    root = fake_v2(tmp_path / "unified")
    lay = detect(f"cgroup2 {root} cgroup2 rw,nsdelegate 0 0\n")
    assert lay.version is CgroupVersion.V2 and lay.v2_mount == str(root)
    assert detect(f"cgroup2 {root} cgroup2 rw 0 0\n", "v1").version is CgroupVersion.NONE


def test_detect_hybrid_picks_v1(tmp_path):
    empty = fake_v2(tmp_path / "unified", controllers="")
    lay = detect(V1_MOUNTS + f"cgroup2 {empty} cgroup2 rw 0 0\n")
    assert lay.version is CgroupVersion.V1
    with_hugetlb_only = fake_v2(tmp_path / "u2", controllers="hugetlb")
    assert detect(V1_MOUNTS + f"cgroup2 {with_hugetlb_only} cgroup2 rw 0 0\n").version is CgroupVersion.V1
    assert detect(V1_MOUNTS + f"cgroup2 {empty} cgroup2 rw 0 0\n", "v2").version is CgroupVersion.NONE


def test_favordynmods_is_read_from_any_cgroup2_mount(tmp_path):
    """The option is global, so a hybrid host's controller-less cgroup2 mount carries it for v1 too;
    v1 mounts cannot take it, and a host with no cgroup2 mount reports None (nothing to set)."""
    empty = fake_v2(tmp_path / "unified", controllers="")
    hybrid = detect(V1_MOUNTS + f"cgroup2 {empty} cgroup2 rw,relatime,favordynmods 0 0\n")
    assert hybrid.version is CgroupVersion.V1 and hybrid.favor_dynmods is True
    assert detect(V1_MOUNTS + f"cgroup2 {empty} cgroup2 rw,relatime 0 0\n").favor_dynmods is False
    assert detect(V1_MOUNTS).favor_dynmods is None
    assert detect(V1_MOUNTS.replace("relatime,memory", "relatime,memory,favordynmods")).favor_dynmods is None
    root = fake_v2(tmp_path / "v2")
    assert detect(f"cgroup2 {root} cgroup2 rw,nsdelegate,favordynmods 0 0\n").favor_dynmods is True


def test_detect_none_and_off():
    lay = detect("proc /proc proc rw 0 0\ncgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n")
    assert lay.version is CgroupVersion.NONE and "no hierarchy" in lay.reason
    only_cpu = "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
    assert detect(only_cpu).version is CgroupVersion.NONE
    assert detect(V1_MOUNTS, "off").version is CgroupVersion.NONE


def test_v2_setup_and_create_write_the_limits(tmp_path):
    root = fake_v2(tmp_path / "cg")
    b = CgroupV2(str(root), "elastane", sanitise("127.0.0.1:8042"), cpu_period_us=50000)
    b.setup()
    node = root / "elastane" / "127.0.0.1_8042"
    assert node.is_dir()
    for d in (root, root / "elastane", node):
        assert (d / "cgroup.subtree_control").read_text() == "+cpu +memory"
    # A real cgroupfs provides these files; the fake one gets them as the kernel would.
    cdir = node / "container_1_0001_01_000001"
    cdir.mkdir()
    (cdir / "memory.swap.max").write_text("max\n")
    cg = b.create("container_1_0001_01_000001", memory_mb=64, vcores=2)
    assert cg.dirs == [str(cdir)]
    assert (cdir / "cpu.max").read_text() == "100000 50000"
    assert (cdir / "memory.max").read_text() == str(64 * 1024 * 1024)
    assert (cdir / "memory.swap.max").read_text() == "0"
    assert (cdir / "memory.oom.group").read_text() == "1"
    assert b.join_files(cg) == [str(cdir / "cgroup.procs")]


def test_v2_quota_follows_the_cores_per_vcore_and_never_drops_below_a_millisecond(tmp_path):
    root = fake_v2(tmp_path / "cg")
    b = CgroupV2(str(root), "elastane", "n1", cpu_period_us=50000, cores_per_vcore=0.25)
    b.setup()
    b.create("c1", 64, 2)
    assert (root / "elastane" / "n1" / "c1" / "cpu.max").read_text() == "25000 50000"
    assert cpu_quota_us(3, 100000) == 300000 and cpu_quota_us(0, 100000, 0.5) == 50000
    assert cpu_quota_us(1, 100000, 0.001) == 1000          # the kernel's minimum


def test_v2_soft_mode_uses_weight(tmp_path):
    root = fake_v2(tmp_path / "cg")
    b = CgroupV2(str(root), "elastane", "n1", hard_cpu=False)
    b.setup()
    b.create("c1", 128, 3)
    d = root / "elastane" / "n1" / "c1"
    assert (d / "cpu.weight").read_text() == "300" and not (d / "cpu.max").exists()
    assert v2_weight(0) == 100 and v2_weight(1000) == 10000


def test_v2_oom_detection_and_removal(tmp_path):
    root = fake_v2(tmp_path / "cg")
    b = CgroupV2(str(root), "elastane", "n1")
    b.setup()
    cg = b.create("c1", 64, 1)
    d = Path(cg.dirs[0])
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    assert not b.oom_killed(cg, died_of_sigkill=True)
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert b.oom_killed(cg, died_of_sigkill=False)
    assert b.peak_memory_bytes(cg) == 0
    (d / "memory.peak").write_text("67108864\n")
    assert b.peak_memory_bytes(cg) == 64 * 1024 * 1024
    assert b.pids(cg) == []
    assert not b.try_remove(cg)  # a plain dir with files is not removable: as a busy cgroup would be
    for f in d.iterdir():
        f.unlink()
    assert b.try_remove(cg) and not d.exists()
    for ctl in (root / "elastane" / "n1", root / "elastane"):  # control files vanish with a real cgroup
        (ctl / "cgroup.subtree_control").unlink()
    b.teardown()
    assert not (root / "elastane").exists()


def test_v2_setup_fails_clearly_when_not_writable(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can write a read-only-mode directory")
    root = fake_v2(tmp_path / "cg")
    root.chmod(0o555)
    with pytest.raises(OSError, match="cannot create cgroup"):
        CgroupV2(str(root), "elastane", "n1").setup()


def test_choose_falls_back_with_one_warning(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    e = choose("auto", "h:1", "elastane", 100000, True, str(mounts))
    assert e.backend is None and e.mode == "rss-monitor"
    assert "falling back to the RSS monitor" in (e.warning or "")
    e = choose("off", "h:1", "elastane", 100000, True, str(mounts))
    assert e.backend is None and "off" in (e.warning or "")
    # A v1 layout whose mount points cannot hold cgroups (a plain file where a dir should be).
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    mounts.write_text(f"cgroup {blocker} cgroup rw,cpu 0 0\ncgroup {blocker} cgroup rw,memory 0 0\n")
    e = choose("auto", "h:1", "elastane", 100000, True, str(mounts))
    assert e.backend is None and "not usable" in (e.warning or "")


def test_v2_choose_on_fake_cgroupfs(tmp_path):
    root = fake_v2(tmp_path / "cg")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {root} cgroup2 rw 0 0\n")
    e = choose("auto", "127.0.0.1:9", "elastane", 100000, True, str(mounts))
    assert e.mode == "v2" and (root / "elastane" / "127.0.0.1_9").is_dir()


def test_v1_failcnt_fallback_on_fake_files(tmp_path):
    b = CgroupV1(str(tmp_path / "cpu"), str(tmp_path / "mem"), "elastane", "n1")
    mem = tmp_path / "mem" / "elastane" / "n1" / "c1"
    mem.mkdir(parents=True)
    cg = ContainerCgroup("c1", [str(tmp_path / "cpu" / "elastane" / "n1" / "c1"), str(mem)])
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")  # an old kernel
    (mem / "memory.failcnt").write_text("12\n")
    assert b.oom_killed(cg, died_of_sigkill=True)
    assert not b.oom_killed(cg, died_of_sigkill=False)
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert not b.oom_killed(cg, died_of_sigkill=True)


def _real_v1() -> tuple[str, str] | None:
    if os.geteuid() != 0:
        return None
    lay = detect(Path("/proc/mounts").read_text(), "v1")
    if lay.version is not CgroupVersion.V1:
        return None
    return lay.v1_mounts["cpu"], lay.v1_mounts["memory"]


REAL_V1 = _real_v1()


@pytest.mark.skipif(REAL_V1 is None, reason="needs root and cgroup v1 cpu + memory hierarchies")
@pytest.mark.cgroups
def test_v1_real_create_limits_and_remove():
    assert REAL_V1 is not None
    cpu_m, mem_m = REAL_V1
    name = f"elastane-test-{uuid.uuid4().hex[:8]}"
    b = CgroupV1(cpu_m, mem_m, name, "node_1", cpu_period_us=50000)
    try:
        b.setup()
        cg = b.create("container_1_0001_01_000001", memory_mb=96, vcores=2)
        cpu_dir, mem_dir = map(Path, cg.dirs)
        assert b.cpu_quota(cg) == (100000, 50000)
        assert int((mem_dir / "memory.limit_in_bytes").read_text()) == 96 * 1024 * 1024
        if (mem_dir / "memory.memsw.limit_in_bytes").exists():
            assert int((mem_dir / "memory.memsw.limit_in_bytes").read_text()) == 96 * 1024 * 1024
        assert not b.oom_killed(cg, died_of_sigkill=False)
        assert b.pids(cg) == []
        soft = CgroupV1(cpu_m, mem_m, name, "node_1", hard_cpu=False)
        cg2 = soft.create("container_1_0001_01_000002", 64, 3)
        assert (Path(cg2.dirs[0]) / "cpu.shares").read_text().strip() == "3072"
        assert b.try_remove(cg) and soft.try_remove(cg2)
        assert not cpu_dir.exists() and not mem_dir.exists()
    finally:
        b.teardown()
    assert not Path(cpu_m, name).exists() and not Path(mem_m, name).exists()
