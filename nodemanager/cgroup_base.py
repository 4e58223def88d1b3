"""What the v1 and v2 cgroup backends share: the per-container record and the backend interface."""
from __future__ import annotations

import abc
import errno
import os
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from protocol.errors import HostError


class CgroupError(HostError, OSError):
    """A cgroup that cannot be created, configured or written."""


@dataclass
class ContainerCgroup:
    """One container's cgroup directories (v1: one per controller; v2: a single one)."""

    container_id: str
    dirs: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"container_id": self.container_id, "dirs": list(self.dirs)}

    @classmethod
    def from_json(cls, d: dict) -> "ContainerCgroup":
        return cls(str(d["container_id"]), [str(x) for x in d.get("dirs", [])])


def sanitise(name: str) -> str:
    """A node id such as "127.0.0.1:8042" made safe as a directory name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def write_file(path: str | Path, value: str) -> None:
    """Write one cgroup control file; errors name the file."""
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise CgroupError(e.errno or errno.EIO, f"cannot write {value!r} to {path}: {e.strerror}") from None


def read_file(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise CgroupError(e.errno or errno.EIO, f"cannot read {path}: {e.strerror}") from None


def read_pids(path: str | Path) -> list[int]:
    """pids listed in a cgroup.procs / tasks file (empty if the cgroup is gone)."""
    try:
        return [int(x) for x in Path(path).read_text().split()]
    except (OSError, ValueError):
        return []


def read_int(path: str | Path) -> int:
    """An integer control file such as memory.max_usage_in_bytes (0 when absent or unreadable)."""
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return 0


def remove_dirs(dirs: list[str]) -> bool:
    """rmdir each of `dirs` (gone already is fine); False if any remains (a cgroup still holding
    processes refuses with EBUSY)."""
    done = True
    for d in dirs:
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            done = False
    return done


MIN_CPU_QUOTA_US = 1000      # the kernel refuses a CFS quota below 1 ms
MIN_CPU_PERIOD_US, MAX_CPU_PERIOD_US = 1000, 1000000      # the kernel's bounds on a CFS period


def cpu_quota_us(vcores: int, period_us: int, cores_per_vcore: float = 1.0) -> int:
    """The CFS quota (us per `period_us`) of a container with `vcores`: one core per vcore, or
    `cores_per_vcore` when the node shares a CPU limit out by vcore (YARN's strict mode)."""
    return max(MIN_CPU_QUOTA_US, round(max(1, vcores) * period_us * cores_per_vcore))


class CgroupBackend(abc.ABC):
    """Creates, limits, watches and removes per-container cgroups under <mount>/<name>/<node>."""

    version: str = ""

    @abc.abstractmethod
    def setup(self) -> None:
        """Create the node's parent cgroup(s); raise CgroupError when the hierarchy is unusable."""

    @abc.abstractmethod
    def make(self, name: str) -> ContainerCgroup:
        """Create the cgroup dir(s) `name` under the node's, without limits (a fresh cgroup has none)."""

    @abc.abstractmethod
    def configure(self, cg: ContainerCgroup, memory_mb: int, vcores: int, cpu_weighted: bool = False) -> None:
        """Set a fresh cgroup's CPU and memory limits."""

    def create(self, container_id: str, memory_mb: int, vcores: int, cpu_weighted: bool = False) -> ContainerCgroup:
        """Create a container's cgroup with its CPU and memory limits (removed again on failure)."""
        cg = self.make(container_id)
        try:
            self.configure(cg, memory_mb, vcores, cpu_weighted)
        except (CgroupError, OSError):
            self.try_remove(cg)
            raise
        return cg

    def rename(self, cg: ContainerCgroup, container_id: str) -> ContainerCgroup:
        """The cgroup made under another name (a pre-started shell's) as the container's. v2 cannot
        rename a cgroup (the kernel refuses), so there it keeps its name: `dirs` say where it is."""
        return ContainerCgroup(container_id, list(cg.dirs))

    @abc.abstractmethod
    def join_files(self, cg: ContainerCgroup) -> list[str]:
        """Files a process writes its own pid into to enter the container's cgroup."""

    @abc.abstractmethod
    def procs_file(self, cg: ContainerCgroup) -> str:
        """The file listing every process of the container (for stragglers)."""

    @abc.abstractmethod
    def oom_killed(self, cg: ContainerCgroup, died_of_sigkill: bool) -> bool:
        """Whether the kernel OOM killer killed a process of this container."""

    @abc.abstractmethod
    def peak_memory_bytes(self, cg: ContainerCgroup) -> int:
        """The container's peak memory use as the kernel recorded it (0 if unknown)."""

    def cpu_usage_ns(self, cg: ContainerCgroup) -> Optional[int]:
        """CPU time the container's processes used so far, in ns; None where this hierarchy does not
        account it (v1 with cpuacct mounted apart from cpu): the sampler then reads /proc."""
        return None

    def memory_usage_bytes(self, cg: ContainerCgroup) -> Optional[int]:
        """The container's memory use less inactive page cache; None when unreadable."""
        return None

    @abc.abstractmethod
    def node_dirs(self) -> list[str]:
        """The node's parent cgroup dirs (removed at shutdown)."""

    def pids(self, cg: ContainerCgroup) -> list[int]:
        return read_pids(self.procs_file(cg))

    def kill_all(self, cg: ContainerCgroup) -> int:
        """SIGKILL every process left in the container's cgroup; returns how many were signalled."""
        n = 0
        for pid in self.pids(cg):
            try:
                os.kill(pid, signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
        return n

    def try_remove(self, cg: ContainerCgroup) -> bool:
        """rmdir the container's cgroup dirs; False while processes remain (EBUSY)."""
        return remove_dirs(cg.dirs)

    def remove_empty(self, prefix: str) -> None:
        """Remove the node's cgroups named `prefix`* that hold no process (a pool's spares a
        previous NM left; one that holds a container it recovers stays: the kernel refuses)."""
        for parent in self.node_dirs():
            try:
                names = [n for n in os.listdir(parent) if n.startswith(prefix)]
            except OSError:
                continue
            for n in names:
                self.try_remove(ContainerCgroup(n, [os.path.join(parent, n)]))

    def teardown(self) -> None:
        """Remove the node's (empty) parent cgroups; the shared top one only if no other NM uses it."""
        for d in self.node_dirs():
            for path in (d, os.path.dirname(d)):
                try:
                    os.rmdir(path)
                except OSError:
                    pass  # busy (another NM, or a container not yet gone) or already removed
