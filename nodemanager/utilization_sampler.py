"""Measures what the node and each running container use: CPU, memory, network, spill bytes.

Counters (CPU time, network bytes) become rates between two samples, over the injected clock's
interval; the first sample of a counter has no rate yet and reports 0. Per container: CPU from
cgroup accounting (v1 cpuacct.usage, v2 cpu.stat usage_usec), else the process tree's utime +
stime from /proc; memory from the cgroup (less inactive page cache), else the tree's RSS; spill
from the bytes under its working dir's `spill/` (where the spill helper writes its lz4 files).
Per node: /proc/stat, /proc/meminfo and /proc/net/dev. Every read is a small file; the sampler
runs in its own loop (utilization_monitor), never on the heartbeat path.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Optional

from protocol.internal_api import ContainerUtilization, NodeUtilization

from . import host_stats, procfs
from .cgroup_base import CgroupBackend, ContainerCgroup

MB = 1024 * 1024
SPILL_SUBDIR = "spill"


@dataclass(frozen=True)
class ContainerProbe:
    """A running container as the sampler needs it."""

    container_id: str
    app_id: str
    pid: int
    work_dir: str
    cgroup: Optional[ContainerCgroup] = None
    role: str = ""


class RateCounters:
    """Rates of monotonic counters between consecutive observations, by key. A counter that went
    backwards (a process of the tree exited and took its ticks along, an interface was reset) gives 0
    for that interval, not a negative rate."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[float, float]] = {}

    def rate(self, key: Hashable, now: float, value: float) -> Optional[float]:
        """Units of `value` per second since the previous observation of `key`; None the first time."""
        prev = self._last.get(key)
        self._last[key] = (now, value)
        if prev is None or now <= prev[0]:
            return None
        return max(0.0, (value - prev[1]) / (now - prev[0]))

    def keep_only(self, keys: set[Hashable]) -> None:
        """Forget the counters of keys no longer observed (finished containers)."""
        for k in [k for k in self._last if k not in keys]:
            del self._last[k]


class UtilizationSampler:
    """One `sample` per call; keeps the previous counters to turn them into rates."""

    def __init__(self, backend: Optional[CgroupBackend], clock: Callable[[], float] = time.time,
                 proc_root: str = "/proc", clk_tck: int = os.sysconf("SC_CLK_TCK"),
                 process_stats: Optional[Callable[[], list[procfs.ProcStat]]] = None):
        self.backend = backend
        self.clock = clock
        self.proc_root = proc_root
        self.clk_tck = clk_tck
        self.process_stats = process_stats or (lambda: procfs.all_stats(proc_root))
        self.counters = RateCounters()

    def sample(self, probes: list[ContainerProbe]) -> NodeUtilization:
        now = self.clock()
        containers: list[ContainerUtilization] = []
        stats: Optional[list[procfs.ProcStat]] = None
        for p in probes:
            cpu_ns = mem = None
            if self.backend is not None and p.cgroup is not None:
                cpu_ns = self.backend.cpu_usage_ns(p.cgroup)
                mem = self.backend.memory_usage_bytes(p.cgroup)
            if cpu_ns is None or mem is None:
                if self.backend is not None and p.cgroup is not None:
                    # The cgroup lists its processes: read just those (v1 with cpuacct mounted apart).
                    tree = [st for st in (procfs.read_stat(pid, self.proc_root)
                                          for pid in self.backend.pids(p.cgroup)) if st is not None]
                else:
                    if stats is None:  # one /proc scan per sample, and only when a container needs it
                        stats = self.process_stats()
                    pids = procfs.tree_pids(p.pid, stats)
                    tree = [s for s in stats if s.pid in pids]
                if cpu_ns is None:
                    # Ticks to ns; a separate key, as the two sources' counters do not compare.
                    cpu_ns = sum(s.utime + s.stime for s in tree) * 1_000_000_000 // self.clk_tck
                    key: Hashable = ("tree", p.container_id)
                else:
                    key = ("cgroup", p.container_id)
                if mem is None:
                    mem = sum(s.rss_pages for s in tree) * procfs.PAGE_SIZE
            else:
                key = ("cgroup", p.container_id)
            cpu = self.counters.rate(key, now, cpu_ns / 1e9)
            containers.append(ContainerUtilization(
                container_id=p.container_id, app_id=p.app_id, cpu_cores=round(cpu or 0.0, 4),
                memory_mb=round(mem / MB, 3), role=p.role,
                spill_bytes=host_stats.dir_bytes(os.path.join(p.work_dir, SPILL_SUBDIR))))
        self.counters.keep_only({("cgroup", p.container_id) for p in probes}
                                | {("tree", p.container_id) for p in probes} | {"cpu", "rx", "tx"})
        node = NodeUtilization(sampled_ms=int(now * 1000), containers=tuple(containers),
                               spill_bytes=sum(c.spill_bytes for c in containers),
                               containers_cpu_cores=round(sum(c.cpu_cores for c in containers), 4),
                               containers_memory_mb=round(sum(c.memory_mb for c in containers), 3))
        stat = host_stats.read_text(f"{self.proc_root}/stat")
        if stat is not None:
            ticks = host_stats.parse_cpu_ticks(stat)
            if ticks is not None:
                node.cpu_cores = round((self.counters.rate("cpu", now, ticks.busy) or 0.0) / self.clk_tck, 4)
            node.host_cores = host_stats.count_cpus(stat)
        meminfo = host_stats.read_text(f"{self.proc_root}/meminfo")
        mi = host_stats.parse_meminfo(meminfo) if meminfo is not None else None
        if mi is not None:
            node.memory_mb = round(mi.used_bytes / MB, 3)
            node.memory_total_mb = round(mi.total_bytes / MB, 3)
        net = host_stats.read_text(f"{self.proc_root}/net/dev")
        if net is not None:
            rx, tx = host_stats.parse_net_dev(net)
            node.net_rx_bytes_per_s = round(self.counters.rate("rx", now, rx) or 0.0, 1)
            node.net_tx_bytes_per_s = round(self.counters.rate("tx", now, tx) or 0.0, 1)
        return node
