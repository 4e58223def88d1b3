"""The NM's recovery dir: one JSON record per live container and the exit-code files.

Records are written atomically (tmp + rename) so a crash never leaves half a record.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional

import orjson

log = logging.getLogger(__name__)


class RecoveryStore:
    """Container records under `<recovery_dir>/containers/`."""

    def __init__(self, recovery_dir: str):
        self.dir = Path(recovery_dir) / "containers"
        self.dir.mkdir(parents=True, exist_ok=True)

    def exit_file(self, container_id: str) -> str:
        return str(self.dir / f"{container_id}.exitcode")

    def save(self, record: dict[str, Any]) -> None:
        cid = record["container_id"]
        tmp = self.dir / f"{cid}.json.tmp"
        tmp.write_bytes(orjson.dumps(record))
        tmp.replace(self.dir / f"{cid}.json")

    def remove(self, container_id: str) -> None:
        for p in (self.dir / f"{container_id}.json", Path(self.exit_file(container_id))):
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def load_all(self) -> list[dict[str, Any]]:
        out = []
        for p in sorted(self.dir.glob("*.json")):
            try:
                out.append(orjson.loads(p.read_bytes()))
            except (OSError, orjson.JSONDecodeError) as e:
                log.warning("ignoring unreadable recovery record %s: %s", p, e)
        return out

    def read_exit_code(self, container_id: str) -> Optional[int]:
        """The exit code the launch wrapper wrote when the command ended, if it did."""
        try:
            return int(Path(self.exit_file(container_id)).read_text().strip())
        except (OSError, ValueError):
            return None

    def exists(self, container_id: str) -> bool:
        return os.path.exists(self.dir / f"{container_id}.json")
