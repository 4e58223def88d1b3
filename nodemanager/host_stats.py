"""Parsing the host's counters for utilization: /proc/stat CPU ticks, /proc/meminfo, /proc/net/dev,
cgroup memory.stat, and the bytes under a directory. Pure functions of file text (paths are
parameters), so tests feed them fake files."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from protocol.kv_text import kv_counter


@dataclass(frozen=True)
class CpuTicks:
    """The aggregate `cpu` line of /proc/stat: busy and total clock ticks since boot."""

    busy: int
    total: int


def parse_cpu_ticks(text: str) -> Optional[CpuTicks]:
    """user nice system idle iowait irq softirq steal (guest time is already inside user/nice);
    idle and iowait are not busy. None when there is no `cpu` line."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            ticks = [int(x) for x in parts[1:9]]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            total = sum(ticks)
            return CpuTicks(busy=total - idle, total=total)
    return None


def count_cpus(text: str) -> int:
    """The `cpuN` lines of /proc/stat: the cores the kernel schedules on."""
    return sum(1 for line in text.splitlines() if line.startswith("cpu") and line[3:4].isdigit())


@dataclass(frozen=True)
class MemInfo:
    total_bytes: int
    available_bytes: int

    @property
    def used_bytes(self) -> int:
        return max(0, self.total_bytes - self.available_bytes)


def parse_meminfo(text: str) -> Optional[MemInfo]:
    """MemTotal and MemAvailable (kernels before 3.14 lack it: MemFree + Buffers + Cached)."""
    kb: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields:
            try:
                kb[name.strip()] = int(fields[0])
            except ValueError:
                continue
    if "MemTotal" not in kb:
        return None
    avail = kb.get("MemAvailable")
    if avail is None:
        avail = kb.get("MemFree", 0) + kb.get("Buffers", 0) + kb.get("Cached", 0)
    return MemInfo(kb["MemTotal"] * 1024, avail * 1024)


def parse_net_dev(text: str, skip: tuple[str, ...] = ("lo",)) -> tuple[int, int]:
    """Received and transmitted bytes summed over the interfaces of /proc/net/dev but `skip`."""
    rx = tx = 0
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep:
            continue  # the two header lines
        name = name.strip()
        fields = rest.split()
        if name in skip or len(fields) < 9:
            continue
        try:
            rx += int(fields[0])
            tx += int(fields[8])
        except ValueError:
            continue
    return rx, tx


def working_set_bytes(usage_bytes: int, memory_stat: str, inactive_file_key: str) -> int:
    """A cgroup's memory usage less its inactive page cache (what the kernel reclaims first), as
    kubelet and docker count a container's memory: the figure comparable with RSS."""
    return max(0, usage_bytes - kv_counter(memory_stat, inactive_file_key))


def dir_bytes(path: str) -> int:
    """Total size of the regular files under `path` (0 when it does not exist); files that vanish
    while it is walked (a spill being deleted) are skipped."""
    total = 0
    stack = [path]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    return total


def read_text(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None
