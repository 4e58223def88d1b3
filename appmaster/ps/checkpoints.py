"""Model checkpoints of a PS job: every server writes its blocks into one directory per cut.

Layout under the AM's durable dir (ELASTANE_AM_DIR)::

    checkpoints/epoch-<N>/manifest-<server>.json, block_<b>.npz   (psruntime.checkpoint's format)
    checkpoints/epoch-<N>/job.json   epoch, objective, the ownership table and the job spec
    checkpoints/epoch-<N>-clock-<C>/...   a cut inside epoch N, after the job's C-th clock (a
                                          kill-based reshape pauses at the next clock boundary)

`job.json` is written last (atomically), so a directory without it is an incomplete checkpoint.
The AM only checkpoints at clock boundaries, when no push is in flight, so a checkpoint is a
consistent cut of the model. (Servers write to the AM's dir directly: on a real multi-host
cluster that dir must be on a shared file system.)
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

from psruntime.checkpoint import load_manifests
from psruntime.dataplane import DataPlaneClient
from psruntime.ownership_table import OwnershipTable

from .executor_pool import ExecutorRecord

JOB_MANIFEST = "job.json"


class CheckpointIncomplete(RuntimeError):
    """The servers' manifests do not cover every model block."""


class Checkpointer:
    """Writes checkpoints of all server blocks under `root` and remembers them."""

    def __init__(self, root: str | os.PathLike[str], client: DataPlaneClient) -> None:
        self.root = Path(root)
        self.client = client
        self.written: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()

    def directory(self, epoch: int, clock: int = 0) -> Path:
        return self.root / (f"epoch-{epoch}-clock-{clock}" if clock else f"epoch-{epoch}")

    async def write(self, epoch: int, table: OwnershipTable, servers: Sequence[ExecutorRecord],
                    job: dict[str, Any], clock: int = 0) -> dict[str, Any]:
        """Checkpoint every block at the start of `epoch` (clock 0) or inside it, after the job's
        `clock`-th clock; returns {"epoch", "clock", "dir", "blocks", "seconds", "time"}."""
        async with self._lock:
            d = self.directory(epoch, clock)
            d.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            await asyncio.gather(*(self.client.request(s.address, {"op": "checkpoint", "dir": str(d)})
                                   for s in servers))
            covered = load_manifests(d, table.num_blocks)
            missing = sorted(set(range(table.num_blocks)) - set(covered))
            if missing:
                raise CheckpointIncomplete(f"checkpoint {d} lacks blocks {missing}")
            manifest = {"epoch": epoch, "clock": clock, "time": time.time(), "num_blocks": table.num_blocks,
                        "table": table.to_wire(), "servers": [s.executor_id for s in servers], **job}
            tmp = d / (JOB_MANIFEST + ".tmp")
            tmp.write_text(json.dumps(manifest))
            os.replace(tmp, d / JOB_MANIFEST)
            info = {"epoch": epoch, "clock": clock, "dir": str(d), "blocks": table.num_blocks,
                    "seconds": round(time.perf_counter() - t0, 4), "time": manifest["time"]}
            self.written.append(info)
            return info

    @property
    def last(self) -> dict[str, Any] | None:
        return self.written[-1] if self.written else None
