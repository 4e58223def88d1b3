"""Optimus's parameter assignment algorithm (PAA, §5.3): model blocks onto servers balancing both the
parameter size and the number of update requests per server.

The paper's algorithm: blocks in decreasing size; avg = total size / servers. A very small block
(< `TINY_FRACTION` of avg) goes to the server with the fewest update requests; a block between that
and avg goes to the server with the smallest remaining capacity (avg minus what it holds) that can
still take it (best fit); a block larger than avg is sliced into avg-sized partitions, each to the
server holding least. Every block (or partition) assigned adds one update request to its server.

Departures, and why:
* A block is Elastane's unit of ownership (keys hash to a fixed number of blocks; the ownership
  table maps whole blocks), so a block larger than avg is not sliced: it goes whole to the server
  holding least, which is where the paper's partitions would go one after another.
* A mid-sized block that no server can still take whole (best fit fails once the capacities are
  nearly used up) goes to the server holding least, as a larger block would.
* Ties go to the lower server index, so the assignment is deterministic.
* PAA's best fit can strand a block and end less balanced than round-robin; the ownership table
  (`owners`) takes whichever of the two balances the sizes better, so it is never worse.

Where it is used (appmaster/ps/model_placement.py): whenever the blocks' sizes are known -- a job
set up again on a checkpoint (the kill-based reshape, which is Optimus's own mechanism, §5.4; a new
AM attempt resuming) takes the sizes of the checkpoint's block files. A fresh job's blocks are
empty until workers push (keys hash uniformly over the blocks), so their sizes are all equal and
round-robin already balances both sizes and requests within one block: the paper's criteria
cannot be improved on there, and the familiar layout is kept.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from psruntime.store.checkpoint import CheckpointError, load_manifests

TINY_FRACTION = 0.01        # §5.3, §6.1: "very small" = below 1% of avg_size


def assign_blocks(sizes: Mapping[int, float], servers: Sequence[str]) -> dict[str, list[int]]:
    """PAA: server -> the blocks it owns (every block of `sizes` assigned exactly once)."""
    if not servers:
        raise ValueError("need at least one server to own blocks")
    n = len(servers)
    total = float(sum(max(0.0, s) for s in sizes.values()))
    avg = total / n
    held = [0.0] * n            # parameter size assigned
    requests = [0] * n          # update requests (blocks) assigned
    out: dict[str, list[int]] = {s: [] for s in servers}
    for block in sorted(sizes, key=lambda b: (-sizes[b], b)):
        size = max(0.0, float(sizes[block]))
        if avg <= 0 or size < TINY_FRACTION * avg:
            i = min(range(n), key=lambda k: (requests[k], held[k], k))
        elif size <= avg:
            fits = [k for k in range(n) if avg - held[k] >= size - 1e-9 * avg]
            i = (min(fits, key=lambda k: (avg - held[k], k)) if fits
                 else min(range(n), key=lambda k: (held[k], requests[k], k)))
        else:
            i = min(range(n), key=lambda k: (held[k], requests[k], k))
        held[i] += size
        requests[i] += 1
        out[servers[i]].append(block)
    for blocks in out.values():
        blocks.sort()
    return out


def spread(assignment: Mapping[str, Sequence[int]], sizes: Mapping[int, float]) -> tuple[float, int]:
    """The paper's balance criteria of an assignment: (largest minus smallest parameter size per
    server, largest minus smallest request count per server)."""
    held = [sum(sizes.get(b, 0.0) for b in blocks) for blocks in assignment.values()]
    counts = [len(blocks) for blocks in assignment.values()]
    return max(held) - min(held), max(counts) - min(counts)


def owners(num_blocks: int, sizes: Mapping[int, float], servers: Sequence[str]) -> list[str]:
    """The ownership table's owner list (block -> server); blocks without a size count as empty.
    PAA is a heuristic and its best fit can strand a block (sizes spread wider than round-robin's):
    of PAA and round-robin, the one with the smaller size spread (then request spread) is used, so
    the result is never less balanced than round-robin."""
    full = {b: float(sizes.get(b, 0.0)) for b in range(num_blocks)}
    paa = assign_blocks(full, servers)
    rr = {s: list(range(i, num_blocks, len(servers))) for i, s in enumerate(servers)}
    best = paa if spread(paa, full) <= spread(rr, full) else rr
    out = [""] * num_blocks
    for server, blocks in best.items():
        for b in blocks:
            out[b] = server
    return out


def checkpoint_block_sizes(directory: str | os.PathLike[str], num_blocks: int) -> dict[int, float]:
    """Bytes of each block's files in a checkpoint directory (either format); {} if unreadable."""
    root = Path(directory)
    try:
        manifest = load_manifests(root, num_blocks)
    except CheckpointError:
        return {}
    out: dict[int, float] = {}
    for block, entry in manifest.items():
        files = [entry["file"]] if isinstance(entry, dict) else [name for _, name in entry]
        try:
            out[block] = float(sum((root / f).stat().st_size for f in files))
        except OSError:
            return {}
    return out


__all__ = ["TINY_FRACTION", "assign_blocks", "checkpoint_block_sizes", "owners", "spread"]
