"""cgroup v2 backend: one unified hierarchy with `cpu` and `memory` enabled down the tree."""
from __future__ import annotations

import os
from typing import Optional

from protocol.kv_text import kv_counter

from . import host_stats
from .cgroup_base import (CgroupBackend, CgroupError, ContainerCgroup, cpu_quota_us, read_file,
                          read_int, write_file)


def v2_weight(vcores: int) -> int:
    """cpu.weight for soft mode: 100 per vcore (the v2 default weight is 100), clamped to 1..10000."""
    return max(1, min(10000, 100 * max(1, vcores)))


class CgroupV2(CgroupBackend):
    """Per container: <mount>/<name>/<node>/<cid> with cpu.max, memory.max, memory.swap.max=0."""

    version = "v2"

    def __init__(self, mount: str, cgroup_name: str, node_dir: str,
                 cpu_period_us: int = 100000, hard_cpu: bool = True, cores_per_vcore: float = 1.0):
        self.mount = mount
        self.top = os.path.join(mount, cgroup_name)
        self.parent = os.path.join(self.top, node_dir)
        self.period = cpu_period_us
        self.hard_cpu = hard_cpu
        self.cores_per_vcore = cores_per_vcore

    def node_dirs(self) -> list[str]:
        return [self.parent]

    def _enable_controllers(self, d: str) -> None:
        path = os.path.join(d, "cgroup.subtree_control")
        enabled = set(read_file(path).split()) if os.path.exists(path) else set()
        missing = [c for c in ("cpu", "memory") if c not in enabled]
        if missing:
            write_file(path, " ".join("+" + c for c in missing))

    def setup(self) -> None:
        try:
            os.makedirs(self.parent, exist_ok=True)
        except OSError as e:
            raise CgroupError(e.errno, f"cannot create cgroup {self.parent}: {e.strerror}") from None
        # Controllers must be enabled in every ancestor's subtree_control for a leaf to use them.
        for d in (self.mount, self.top, self.parent):
            self._enable_controllers(d)

    def make(self, name: str) -> ContainerCgroup:
        d = os.path.join(self.parent, name)
        os.makedirs(d, exist_ok=True)
        return ContainerCgroup(name, [d])

    def configure(self, cg: ContainerCgroup, memory_mb: int, vcores: int, cpu_weighted: bool = False) -> None:
        d = cg.dirs[0]
        if self.hard_cpu and not cpu_weighted:
            write_file(os.path.join(d, "cpu.max"),
                       f"{cpu_quota_us(vcores, self.period, self.cores_per_vcore)} {self.period}")
        else:
            write_file(os.path.join(d, "cpu.weight"), str(v2_weight(vcores)))
        write_file(os.path.join(d, "memory.max"), str(memory_mb * 1024 * 1024))
        swap = os.path.join(d, "memory.swap.max")
        if os.path.exists(swap):  # absent when the kernel has no swap accounting
            write_file(swap, "0")
        # Kill the whole container on OOM, not one random process of it.
        write_file(os.path.join(d, "memory.oom.group"), "1")

    def join_files(self, cg: ContainerCgroup) -> list[str]:
        return [os.path.join(cg.dirs[0], "cgroup.procs")]

    def procs_file(self, cg: ContainerCgroup) -> str:
        return os.path.join(cg.dirs[0], "cgroup.procs")

    def oom_killed(self, cg: ContainerCgroup, died_of_sigkill: bool) -> bool:
        try:
            events = read_file(os.path.join(cg.dirs[0], "memory.events"))
        except CgroupError:
            return False
        return kv_counter(events, "oom_kill") > 0 or kv_counter(events, "oom_group_kill") > 0

    def peak_memory_bytes(self, cg: ContainerCgroup) -> int:
        return read_int(os.path.join(cg.dirs[0], "memory.peak"))  # kernels >= 5.19

    def cpu_usage_ns(self, cg: ContainerCgroup) -> Optional[int]:
        text = host_stats.read_text(os.path.join(cg.dirs[0], "cpu.stat"))
        return None if text is None else kv_counter(text, "usage_usec") * 1000

    def memory_usage_bytes(self, cg: ContainerCgroup) -> Optional[int]:
        usage = host_stats.read_text(os.path.join(cg.dirs[0], "memory.current"))
        stat = host_stats.read_text(os.path.join(cg.dirs[0], "memory.stat")) or ""
        try:
            return host_stats.working_set_bytes(int(usage), stat, "inactive_file") if usage else None
        except ValueError:
            return None

    def kill_all(self, cg: ContainerCgroup) -> int:
        # cgroup.kill (5.14+) kills everything atomically, including processes forking right now.
        kill = os.path.join(cg.dirs[0], "cgroup.kill")
        if os.path.exists(kill):
            try:
                write_file(kill, "1")
            except CgroupError:
                pass
        return super().kill_all(cg)
