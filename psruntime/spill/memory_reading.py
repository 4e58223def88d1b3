"""What memory a container's process is charged with, as the limit that kills it counts it.

The spill tuner (alpha_tuner.py) and the model-spill monitor weigh "memory in use" against the
container's limit. Where the NM enforces that limit with a cgroup (cgroup_v1 / cgroup_v2), the kernel
kills the container when the cgroup's *charge* passes `memory.limit_in_bytes` / `memory.max`, and
the charge is not this process's RSS:

- an executor forked warm from the NM's zygote (nodemanager/zygote.py) shares the zygote's
  preloaded pages (numpy, the data plane: tens of MB); /proc/self/statm counts them in its RSS, but
  they stay charged to the NM's cgroup, so RSS overstates what the limit sees;
- the spill files a worker writes and reads go through the page cache, which is charged to the
  container's cgroup and is in no RSS; the kernel reclaims it (it is clean, or written back) before
  it kills, so it is no pressure.

So `ContainerMemory` reads the container's own cgroup (found from /proc/self/cgroup and the mount
table): its usage less its file page cache, active and inactive (`memory.usage_in_bytes` less
`total_active_file` + `total_inactive_file` on v1, `memory.current` less `active_file` +
`inactive_file` on v2), and its limit. Unlike the NM's utilization sampler (usage less inactive
file only, the usual working set) it takes out the active file pages too: a spill file read back
every epoch turns active, and counting it would make the tuner spill more to relieve the pressure
its own spill files make. Where there is no memory cgroup with a limit (no cgroups, or the NM's RSS
monitor enforces instead: nodemanager/rss_monitor.py, which sums the process tree's RSS) it reads
/proc/self/statm's RSS, which is then what the limit is judged on.

Pure parsing functions plus a reader whose paths are parameters, so tests use a fake /proc and
cgroupfs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from protocol.kv_text import kv_counter

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# A v1 cgroup without a limit reports a huge number (PAGE_COUNTER_MAX pages); anything past this is none.
_NO_LIMIT = 1 << 60


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text()
    except OSError:
        return None


def read_statm_rss(statm: str | Path = "/proc/self/statm") -> int:
    """A process's resident set size (bytes) from its statm; 0 where there is none."""
    text = _read(Path(statm))
    try:
        return int(text.split()[1]) * _PAGE if text else 0
    except (IndexError, ValueError):
        return 0


@dataclass(frozen=True)
class MemoryCgroup:
    """The memory cgroup dir of a process and its cgroup version ("v1" or "v2")."""

    path: Path
    version: str

    @property
    def usage_file(self) -> Path:
        return self.path / ("memory.usage_in_bytes" if self.version == "v1" else "memory.current")

    @property
    def limit_file(self) -> Path:
        return self.path / ("memory.limit_in_bytes" if self.version == "v1" else "memory.max")

    @property
    def file_keys(self) -> tuple[str, str]:
        """memory.stat's counters of file page cache (reclaimable: not what kills)."""
        if self.version == "v1":
            return "total_active_file", "total_inactive_file"
        return "active_file", "inactive_file"


def find_memory_cgroup(proc_cgroup: str, mountinfo: str) -> Optional[MemoryCgroup]:
    """The memory cgroup dir named by a /proc/<pid>/cgroup text, through the mounts in a
    /proc/<pid>/mountinfo text (a mount's root may be a sub-cgroup, as in a container); a v1
    `memory` controller wins over the v2 unified entry (a hybrid host keeps memory on v1)."""
    v1_path = v2_path = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, mount_point, fstype, options = fields[3], fields[4], tail[0], tail[2].split(",")
        if v1_path is not None and fstype == "cgroup" and "memory" in options:
            rel = os.path.relpath(v1_path, root)
            if not rel.startswith(".."):
                return MemoryCgroup(Path(mount_point) / rel, "v1")
        if v1_path is None and v2_path is not None and fstype == "cgroup2":
            rel = os.path.relpath(v2_path, root)
            if not rel.startswith(".."):
                return MemoryCgroup(Path(mount_point) / rel, "v2")
    return None


class ContainerMemory:
    """Reads the memory a container's process is charged with and its limit (see the module doc)."""

    def __init__(self, proc: str | Path = "/proc/self") -> None:
        proc = Path(proc)
        self.statm = proc / "statm"
        cg = _read(proc / "cgroup")
        info = _read(proc / "mountinfo")
        found = find_memory_cgroup(cg, info) if cg is not None and info is not None else None
        # Only a cgroup with a limit of its own stands for the container: the NM's; an unlimited
        # one (a process not launched in a container cgroup) says nothing about what gets it killed.
        self.cgroup = found if found is not None and self._limit_of(found) > 0 else None

    @staticmethod
    def _limit_of(cg: MemoryCgroup) -> int:
        text = (_read(cg.limit_file) or "").strip()
        if not text.isdigit():
            return 0            # v2 "max", or unreadable
        n = int(text)
        return n if n < _NO_LIMIT else 0

    @property
    def source(self) -> str:
        """"cgroup v1", "cgroup v2" or "rss": what `used_bytes` reads."""
        return f"cgroup {self.cgroup.version}" if self.cgroup is not None else "rss"

    def limit_bytes(self) -> int:
        """The cgroup's memory limit (0: no cgroup with a limit)."""
        return self._limit_of(self.cgroup) if self.cgroup is not None else 0

    def used_bytes(self) -> int:
        """The container's charged memory less its file page cache, or this process's RSS."""
        cg = self.cgroup
        if cg is not None:
            usage = (_read(cg.usage_file) or "").strip()
            if usage.isdigit():
                stat = _read(cg.path / "memory.stat") or ""
                return max(0, int(usage) - sum(kv_counter(stat, k) for k in cg.file_keys))
        return read_statm_rss(self.statm)

    def __call__(self) -> int:
        return self.used_bytes()


__all__ = ["ContainerMemory", "MemoryCgroup", "find_memory_cgroup", "read_statm_rss"]
