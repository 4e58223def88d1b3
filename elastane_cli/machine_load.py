"""How busy the whole machine was over a measurement, and whether that leaves the measurement usable.

Timings on testbed hosts (CPU budgets on one machine, docs/testbed.md) hold only while the machine
can give every host its budget: once its cores are all busy (other work, the master's RM and AMs,
the kernel's link shaping), every host runs slower than its budget says and a calibration or
fidelity figure measures that contention instead of the system. Each measurement therefore records

- `busy_share`: the share of all the machine's cores busy between two readings of /proc/stat
  (user + system + ..., everything but idle and iowait), and
- `load_per_core`: the 1-minute load average over the cores, the mean of readings at start and end
  (runnable tasks: work waiting for a core that the busy share, capped at 1, cannot show);

and `SaturationLimits.refuse` says why a measurement is refused (None: accepted). A refused
measurement is reported, never used in a fit or an error.

On testbed hosts with CPU budgets (`SaturationLimits.budgeted_hosts`) only the busy share decides:
a task that waits for its host's budget to refill is runnable and counts in the load, so there the
load measures the budgets doing their job, not a saturated machine. Measured during calibration
runs (2026-11-29, 2 cores, 4 hosts of 0.375 core): 1.8-3.4 runnable tasks per core on average
while the jobs trained, at 30-41 % busy; a task waits for a core only once every core is busy,
which the busy share shows. The load is still recorded with every measurement.
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
    """Above either limit the machine was saturated and the measurement is refused (a limit of
    None is not applied)."""

    busy_share: float = BUSY_SHARE_LIMIT
    load_per_core: Optional[float] = LOAD_PER_CORE_LIMIT

    def __post_init__(self) -> None:
        if not 0.0 < self.busy_share <= 1.0:
            raise ValueError(f"busy_share limit must be in (0, 1], got {self.busy_share}")
        if self.load_per_core is not None and not self.load_per_core > 0.0:
            raise ValueError(f"load_per_core limit must be > 0, got {self.load_per_core}")

    @classmethod
    def budgeted_hosts(cls) -> "SaturationLimits":
        """For measurements on testbed hosts with CPU budgets: the busy share alone (module doc)."""
        return cls(BUSY_SHARE_LIMIT, None)

    def describe(self) -> str:
        return f"above {self.busy_share:.0%} busy" + (
            "" if self.load_per_core is None else f" or {self.load_per_core:g} load per core")

    def refuse(self, load: MachineLoad) -> Optional[str]:
        """Why a measurement taken under `load` is refused; None when the machine was not saturated."""
        why = []
        if load.busy_share > self.busy_share:
            why.append(f"machine {load.busy_share:.0%} busy (limit {self.busy_share:.0%})")
        if self.load_per_core is not None and load.load_per_core > self.load_per_core:
            why.append(f"load {load.load_per_core:.2f} per core (limit {self.load_per_core:.2f})")
        return "; ".join(why) or None


class MachineMeter:
    """Measures the machine between `start()` and `stop()` (readers injectable for tests)."""

    def __init__(self, read_cpu: Callable[[], tuple[float, float]] = cpu_seconds,
                 read_load: Callable[[], float] = lambda: os.getloadavg()[0],
                 cores: Optional[int] = None) -> None:
        self.read_cpu = read_cpu
        self.read_load = read_load
        self.cores = cores or os.cpu_count() or 1
        self._cpu0: Optional[tuple[float, float]] = None
        self._load0 = 0.0

    def start(self) -> "MachineMeter":
        """Begin (or begin again: the window starts now) the measurement."""
        self._cpu0 = self.read_cpu()
        self._load0 = self.read_load()
        return self

    def stop(self) -> MachineLoad:
        if self._cpu0 is None:
            raise RuntimeError("MachineMeter.stop() before start()")
        busy1, all1 = self.read_cpu()
        busy0, all0 = self._cpu0
        share = (busy1 - busy0) / max(1e-9, all1 - all0)
        load = (self._load0 + self.read_load()) / 2
        self._cpu0 = None
        return MachineLoad(min(1.0, max(0.0, share)), load / self.cores, self.cores)


__all__ = ["BUSY_SHARE_LIMIT", "LOAD_PER_CORE_LIMIT", "MachineLoad", "MachineMeter", "SaturationLimits", "cpu_seconds"]
