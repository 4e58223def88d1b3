"""CPU accounting helpers for the tests that check a container's CPU cap."""
from __future__ import annotations

import os


def machine_cpu_ticks() -> tuple[int, int]:
    """(busy, idle) clock ticks of the whole machine so far, from /proc/stat's `cpu` line."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
    return sum(fields) - idle, idle


def idle_cores(before: tuple[int, int], after: tuple[int, int], seconds: float) -> float:
    """Cores the machine left idle between two `machine_cpu_ticks()` readings `seconds` apart."""
    return (after[1] - before[1]) / os.sysconf("SC_CLK_TCK") / seconds


def check_held_to_one_core(cores: float, idle: float) -> str | None:
    """Why a 1-vcore container's measured use is wrong, or None.

    Over the cap (> 1.2 cores) is always wrong. Under 0.5 cores is wrong only if the machine had
    spare CPU (>= 0.5 idle cores) at the same time: then the container was held below its quota.
    When other work saturates the machine, low use says nothing about the cap.
    """
    if cores > 1.2:
        return f"container used {cores:.2f} cores with a 1-vcore quota"
    if cores < 0.5 and idle >= 0.5:
        return f"container used only {cores:.2f} cores while {idle:.2f} cores were idle"
    return None
