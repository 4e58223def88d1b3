"""How busy the whole machine was over a measurement, and whether that leaves the measurement usable.

Timings on testbed hosts (CPU budgets on one machine, docs/testbed.md) hold only while the machine
can give every host its budget: once its cores are all busy (other work, the master's RM and AMs,
the kernel's link shaping), every host runs slower than its budget says and a calibration or
fidelity figure measures that contention instead of the system. Each measurement therefore records

- `busy_share`: the share of all the machine's cores busy between two readings of /proc/stat
  (user + system + ..., everything but idle and iowait), and
- `load_per_core`: runnable tasks per core (work waiting for a core, which the busy share, capped
  at 1, cannot show). Where the caller samples the window (`MachineMeter.sample`, e.g. every poll
  of a run's training), it is the mean of the tasks runnable at each sample (/proc/loadavg's
  fourth field, the reader left out); else the 1-minute load average, the mean of readings at
  start and end. The load average lags by a minute: for a run of a few seconds it mostly holds
  the runs before it and the run's own start (a 24-executor job forks them at once: 12-18
  runnable for about 2 s), so `elastane sim calibrate` samples the epochs it times instead;

and `SaturationLimits.refuse` says why a measurement is refused (None: accepted). A refused
measurement is reported, never used in a fit or an error.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

# Defaults: 90 % of the cores busy or more runnable tasks than cores. The testbed's budgets are
# sized to leave a quarter of the machine to the master and the kernel (sim calibrate's plan), so a
# quiet machine stays under both; above them the hosts no longer get their budgets.
BUSY_SHARE_LIMIT = 0.9
LOAD_PER_CORE_LIMIT = 1.0


def cpu_seconds(stat_path: str = "/proc/stat") -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot (/proc/stat's first line)."""
    with open(stat_path) as f:
        ticks = [float(x) for x in f.readline().split()[1:]]
    hz = float(os.sysconf("SC_CLK_TCK"))
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)      # idle + iowait
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


def runnable_tasks(loadavg_path: str = "/proc/loadavg") -> int:
    """Tasks runnable right now on the whole machine, the reading process left out."""
    with open(loadavg_path) as f:
        running = int(f.read().split()[3].split("/")[0])
    return max(0, running - 1)


@dataclass(frozen=True)
class MachineLoad:
    """The machine over one measurement (module doc)."""

    busy_share: float
    load_per_core: float
    cores: int

    def to_json(self) -> dict[str, float]:
        return {"busy_share": round(self.busy_share, 3), "load_per_core": round(self.load_per_core, 3),
                "cores": self.cores}


@dataclass(frozen=True)
class SaturationLimits:
    """Above either limit the machine was saturated and the measurement is refused."""

    busy_share: float = BUSY_SHARE_LIMIT
    load_per_core: float = LOAD_PER_CORE_LIMIT

    def __post_init__(self) -> None:
        if not 0.0 < self.busy_share <= 1.0:
            raise ValueError(f"busy_share limit must be in (0, 1], got {self.busy_share}")
        if not self.load_per_core > 0.0:
            raise ValueError(f"load_per_core limit must be > 0, got {self.load_per_core}")

    def refuse(self, load: MachineLoad) -> Optional[str]:
        """Why a measurement taken under `load` is refused; None when the machine was not saturated."""
        why = []
        if load.busy_share > self.busy_share:
            why.append(f"machine {load.busy_share:.0%} busy (limit {self.busy_share:.0%})")
        if load.load_per_core > self.load_per_core:
            why.append(f"load {load.load_per_core:.2f} per core (limit {self.load_per_core:.2f})")
        return "; ".join(why) or None


class MachineMeter:
    """Measures the machine between `start()` and `stop()` (readers injectable for tests)."""

    def __init__(self, read_cpu: Callable[[], tuple[float, float]] = cpu_seconds,
                 read_load: Callable[[], float] = lambda: os.getloadavg()[0],
                 cores: Optional[int] = None, read_runnable: Callable[[], int] = runnable_tasks) -> None:
        self.read_cpu = read_cpu
        self.read_load = read_load
        self.read_runnable = read_runnable
        self.cores = cores or os.cpu_count() or 1
        self._cpu0: Optional[tuple[float, float]] = None
        self._load0 = 0.0
        self._runnable: list[int] = []

    def start(self) -> "MachineMeter":
        self._cpu0 = self.read_cpu()
        self._load0 = self.read_load()
        self._runnable = []
        return self

    def sample(self) -> None:
        """Count the tasks runnable now: with samples, `load_per_core` is their mean (module doc)."""
        self._runnable.append(self.read_runnable())

    def stop(self) -> MachineLoad:
        if self._cpu0 is None:
            raise RuntimeError("MachineMeter.stop() before start()")
        busy1, all1 = self.read_cpu()
        busy0, all0 = self._cpu0
        share = (busy1 - busy0) / max(1e-9, all1 - all0)
        load = (sum(self._runnable) / len(self._runnable) if self._runnable
                else (self._load0 + self.read_load()) / 2)
        self._cpu0 = None
        return MachineLoad(min(1.0, max(0.0, share)), load / self.cores, self.cores)


__all__ = ["BUSY_SHARE_LIMIT", "LOAD_PER_CORE_LIMIT", "MachineLoad", "MachineMeter", "SaturationLimits", "cpu_seconds",
           "runnable_tasks"]
