"""The NM's recovery dir: the records of its containers, as one append-only journal, and the
exit-code files the launch wrappers write.

The journal (`containers/containers.jsonl`) holds one JSON line per change: `{"put": record}` (a
container's record, the last put wins) or `{"del": container_id}`. Replaying it gives the live
records, as YARN's NM state store (a LevelDB) does. Why a journal rather than a file per container
written with tmp + rename: each such write created an inode and each removal freed one, two of each
per container, and on an ext4 without a journal (a common VM disk) every inode created next to many
recently freed ones scans them (`recently_deleted`): 250 us per create measured in a busy /tmp, on
the launch path. An append is one write(2) into an open file.

Crash safety: each change is one write of one line, so a crash leaves at most a torn last line,
which replay skips. The journal is compacted (the live records written to a temp file renamed over
it) when it is opened and whenever it holds COMPACT_FACTOR times more lines than live records (at
least COMPACT_MIN_LINES). Records of the old layout (`<id>.json` files) are read once, folded into
the journal and removed.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional

import orjson

from protocol.durable_storage import write_atomic

log = logging.getLogger(__name__)

JOURNAL = "containers.jsonl"
COMPACT_MIN_LINES = 1024
COMPACT_FACTOR = 4


class RecoveryStore:
    """Container records under `<recovery_dir>/containers/` (see the module doc).

    One store per recovery dir and process: the journal is replayed when the store is opened, and
    the store's own changes are appended from then on.
    """

    def __init__(self, recovery_dir: str):
        self.dir = Path(recovery_dir) / "containers"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._path = self.dir / JOURNAL
        self._records = read_records(recovery_dir)
        self._lines = 0
        self._fd = -1
        self._compact()     # also folds in the old layout's files and drops a torn last line

    def exit_file(self, container_id: str) -> str:
        return str(self.dir / f"{container_id}.exitcode")

    def save(self, record: dict[str, Any]) -> None:
        cid = record["container_id"]
        self._records[cid] = record
        self._append({"put": record})

    def remove(self, container_id: str) -> None:
        if self._records.pop(container_id, None) is not None:
            self._append({"del": container_id})
        try:
            os.unlink(self.exit_file(container_id))
        except FileNotFoundError:
            pass

    def load_all(self) -> list[dict[str, Any]]:
        """The live records, in container-id order."""
        return [self._records[cid] for cid in sorted(self._records)]

    def read_exit_code(self, container_id: str) -> Optional[int]:
        """The exit code the launch wrapper wrote when the command ended, if it did."""
        try:
            return int(Path(self.exit_file(container_id)).read_text().strip())
        except (OSError, ValueError):
            return None

    def exists(self, container_id: str) -> bool:
        return container_id in self._records

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- journal -----------------------------------------------------------------------------
    def _append(self, change: dict[str, Any]) -> None:
        os.write(self._fd, orjson.dumps(change) + b"\n")   # O_APPEND: one write, one line
        self._lines += 1
        if self._lines >= max(COMPACT_MIN_LINES, COMPACT_FACTOR * len(self._records)):
            self._compact()

    def _compact(self) -> None:
        """Write the live records as a fresh journal (temp file renamed over the old one)."""
        # durable: the journal is what a restarted NM recovers its containers from
        write_atomic(self._path, b"".join(orjson.dumps({"put": self._records[cid]}) + b"\n"
                                          for cid in sorted(self._records)))
        self.close()
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._lines = len(self._records)
        for path in self.dir.glob("*.json"):     # folded into the journal above
            path.unlink(missing_ok=True)


def read_records(recovery_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The live container records under `<recovery_dir>/containers/` by container id: the journal
    replayed, with the old layout's files read first. Reads only: the store opens with it, and
    the local cluster's reaper reads a dead NM's records with it (elastane_cli.container_reaper)."""
    d = Path(recovery_dir) / "containers"
    records: dict[str, dict[str, Any]] = {}
    for path in sorted(d.glob("*.json")):    # the old layout: one file per container
        try:
            rec = orjson.loads(path.read_bytes())
            records[str(rec["container_id"])] = rec
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as e:
            log.warning("ignoring unreadable recovery record %s: %s", path, e)
    journal = d / JOURNAL
    try:
        data = journal.read_bytes()
    except FileNotFoundError:
        return records
    for n, line in enumerate(data.splitlines(), 1):
        try:
            change = orjson.loads(line)
            if "put" in change:
                records[str(change["put"]["container_id"])] = change["put"]
            else:
                records.pop(str(change["del"]), None)
        except (orjson.JSONDecodeError, KeyError, TypeError) as e:
            # A crash mid-append leaves a torn last line; anything else is damage, said so.
            log.warning("ignoring unreadable line %d of %s: %s", n, journal, e)
    return records
