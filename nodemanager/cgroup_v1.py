"""cgroup v1 backend: separate `cpu` and `memory` hierarchies (also the hybrid layout)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from protocol.kv_text import kv_counter

from . import host_stats
from .cgroup_base import (CgroupBackend, CgroupError, ContainerCgroup, cpu_quota_us, read_file,
                          read_int, write_file)


def inherited_quota_us(mount: str, node_dir: str, period_us: int) -> Optional[int]:
    """The tightest CPU quota, in us per `period_us`, on the way from the hierarchy's root (as this
    NM sees it) down to its node dir; None when none is set. v1 refuses a child quota above its
    parent's (EINVAL), so a host whose cgroup root carries a budget -- a container or a VM slice
    with a CPU limit, a testbed host -- caps each container's quota at it (v2 nests limits instead)."""
    tightest: Optional[int] = None
    d = Path(node_dir)
    chain = [d, *d.parents]
    for c in chain:
        try:
            quota = int((c / "cpu.cfs_quota_us").read_text())
            period = int((c / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            quota = period = -1
        if quota > 0 and period > 0:
            scaled = quota * period_us // period
            tightest = scaled if tightest is None else min(tightest, scaled)
        if c == Path(mount):
            break
    return tightest


class CgroupV1(CgroupBackend):
    """Per container: <cpu mount>/<name>/<node>/<cid> and <memory mount>/<name>/<node>/<cid>."""

    version = "v1"

    def __init__(self, cpu_mount: str, memory_mount: str, cgroup_name: str, node_dir: str,
                 cpu_period_us: int = 100000, hard_cpu: bool = True, cores_per_vcore: float = 1.0):
        self.cpu_parent = os.path.join(cpu_mount, cgroup_name, node_dir)
        self.mem_parent = os.path.join(memory_mount, cgroup_name, node_dir)
        self.cpu_mount = cpu_mount
        self.period = cpu_period_us
        self.hard_cpu = hard_cpu
        self.cores_per_vcore = cores_per_vcore
        self.quota_ceiling_us: Optional[int] = None   # see inherited_quota_us

    def node_dirs(self) -> list[str]:
        return [self.cpu_parent, self.mem_parent]

    def setup(self) -> None:
        for d in self.node_dirs():
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as e:
                raise CgroupError(e.errno, f"cannot create cgroup {d}: {e.strerror}") from None
            if not os.access(os.path.join(d, "tasks"), os.W_OK):
                raise CgroupError(13, f"cgroup {d} is not writable")
        self.quota_ceiling_us = inherited_quota_us(self.cpu_mount, self.cpu_parent, self.period)
        # Make memory accounting hierarchical where the kernel still allows the choice.
        try:
            write_file(os.path.join(self.mem_parent, "memory.use_hierarchy"), "1")
        except CgroupError:
            pass

    def _dirs(self, container_id: str) -> tuple[str, str]:
        return os.path.join(self.cpu_parent, container_id), os.path.join(self.mem_parent, container_id)

    def make(self, name: str) -> ContainerCgroup:
        cg = ContainerCgroup(name, list(self._dirs(name)))
        try:
            for d in cg.dirs:
                os.makedirs(d, exist_ok=True)
        except OSError:
            self.try_remove(cg)
            raise
        return cg

    def configure(self, cg: ContainerCgroup, memory_mb: int, vcores: int, cpu_weighted: bool = False) -> None:
        cpu_dir, mem_dir = cg.dirs
        if self.hard_cpu and not cpu_weighted:
            # Period first: the kernel checks quota against the current period.
            write_file(os.path.join(cpu_dir, "cpu.cfs_period_us"), str(self.period))
            quota = cpu_quota_us(vcores, self.period, self.cores_per_vcore)
            if self.quota_ceiling_us is not None:
                quota = min(quota, self.quota_ceiling_us)
            write_file(os.path.join(cpu_dir, "cpu.cfs_quota_us"), str(quota))
        else:
            write_file(os.path.join(cpu_dir, "cpu.shares"), str(1024 * max(1, vcores)))
        limit = str(memory_mb * 1024 * 1024)
        # The swap limit (memsw) must stay >= the memory limit, so order depends on direction;
        # a fresh cgroup is unlimited, so memory first, then memsw to the same value (no swap).
        write_file(os.path.join(mem_dir, "memory.limit_in_bytes"), limit)
        memsw = os.path.join(mem_dir, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):
            write_file(memsw, limit)
        swappiness = os.path.join(mem_dir, "memory.swappiness")
        if os.path.exists(swappiness):
            try:
                write_file(swappiness, "0")
            except CgroupError:
                pass

    def rename(self, cg: ContainerCgroup, container_id: str) -> ContainerCgroup:
        # cgroup v1 renames a cgroup within its parent; a dir that cannot be renamed keeps its name
        # (the record's dirs say where each one is).
        dirs = []
        for old, new in zip(cg.dirs, self._dirs(container_id)):
            try:
                os.rename(old, new)
                dirs.append(new)
            except OSError:
                dirs.append(old)
        return ContainerCgroup(container_id, dirs)

    def join_files(self, cg: ContainerCgroup) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in cg.dirs]

    def procs_file(self, cg: ContainerCgroup) -> str:
        return os.path.join(cg.dirs[1], "cgroup.procs")

    def oom_killed(self, cg: ContainerCgroup, died_of_sigkill: bool) -> bool:
        mem_dir = cg.dirs[1]
        try:
            ctl = read_file(os.path.join(mem_dir, "memory.oom_control"))
        except CgroupError:
            return False
        if "oom_kill " in ctl:  # kernels >= 4.13 count kills
            return kv_counter(ctl, "oom_kill") > 0
        try:
            failcnt = int(read_file(os.path.join(mem_dir, "memory.failcnt")).strip() or 0)
        except (CgroupError, ValueError):
            return False
        return failcnt > 0 and died_of_sigkill

    def peak_memory_bytes(self, cg: ContainerCgroup) -> int:
        return read_int(os.path.join(cg.dirs[1], "memory.max_usage_in_bytes"))

    def cpu_usage_ns(self, cg: ContainerCgroup) -> Optional[int]:
        # cpuacct.usage sits in the cpu dir only where cpu and cpuacct share a mount (cpu,cpuacct).
        text = host_stats.read_text(os.path.join(cg.dirs[0], "cpuacct.usage"))
        try:
            return int(text) if text is not None else None
        except ValueError:
            return None

    def memory_usage_bytes(self, cg: ContainerCgroup) -> Optional[int]:
        mem_dir = cg.dirs[1]
        usage = host_stats.read_text(os.path.join(mem_dir, "memory.usage_in_bytes"))
        stat = host_stats.read_text(os.path.join(mem_dir, "memory.stat")) or ""
        try:
            return host_stats.working_set_bytes(int(usage), stat, "total_inactive_file") if usage else None
        except ValueError:
            return None

    def cpu_quota(self, cg: ContainerCgroup) -> tuple[int, int]:
        """(quota, period) of the container's cpu cgroup, for diagnostics and tests."""
        d = Path(cg.dirs[0])
        return int((d / "cpu.cfs_quota_us").read_text()), int((d / "cpu.cfs_period_us").read_text())
