"""Parsing the kernel's "key value" per line files (cgroup memory.stat / memory.events / cpu.stat),
read by the NodeManager's cgroup backends and by an executor's spill tuner alike."""
from __future__ import annotations


def kv_counter(text: str, key: str) -> int:
    """The value of `key` in a "key value" per line text; 0 when absent or not an integer."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                return int(parts[1])
            except ValueError:
                return 0
    return 0


__all__ = ["kv_counter"]
