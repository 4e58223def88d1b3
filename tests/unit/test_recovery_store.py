"""The NM's recovery journal: replay after a restart, torn last lines, compaction, the old layout,
and no file created or removed per record."""
from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from nodemanager import recovery_store
from nodemanager.recovery_store import JOURNAL, RecoveryStore


def rec(cid: str, pid: int = 100, **extra: object) -> dict[str, object]:
    return {"container_id": cid, "pid": pid, **extra}


def test_a_reopened_store_has_the_last_record_of_each_live_container(tmp_path: Path) -> None:
    s = RecoveryStore(str(tmp_path))
    s.save(rec("c1", 10))
    s.save(rec("c2", 20))
    s.save(rec("c1", 11, final={"exit_status": 0}))   # the last put wins
    s.save(rec("c3", 30))
    Path(s.exit_file("c3")).write_text("0\n")
    s.remove("c3")
    assert not Path(s.exit_file("c3")).exists()
    again = RecoveryStore(str(tmp_path))
    assert again.load_all() == [rec("c1", 11, final={"exit_status": 0}), rec("c2", 20)]
    assert again.exists("c2") and not again.exists("c3")


def test_records_and_removals_create_no_files(tmp_path: Path) -> None:
    """One journal file, appended to: no inode made or freed per record (the point of it)."""
    s = RecoveryStore(str(tmp_path))
    before = {p.name: p.stat().st_ino for p in s.dir.iterdir()}
    for i in range(50):
        s.save(rec(f"c{i}"))
        s.save(rec(f"c{i}", final={"exit_status": 0}))
    for i in range(0, 50, 2):
        s.remove(f"c{i}")
    assert {p.name: p.stat().st_ino for p in s.dir.iterdir()} == before == {JOURNAL: before[JOURNAL]}
    assert len(RecoveryStore(str(tmp_path)).load_all()) == 25


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = RecoveryStore(str(tmp_path))
    s.save(rec("c1"))
    s.save(rec("c2"))
    with open(s.dir / JOURNAL, "ab") as f:
        f.write(orjson.dumps({"put": rec("c3")})[:17])     # a crash mid-append
    with caplog.at_level(logging.WARNING):
        again = RecoveryStore(str(tmp_path))
    assert [r["container_id"] for r in again.load_all()] == ["c1", "c2"]
    assert "unreadable line 3" in caplog.text
    again.save(rec("c4"))                                  # the torn line is gone: appends still parse
    assert [r["container_id"] for r in RecoveryStore(str(tmp_path)).load_all()] == ["c1", "c2", "c4"]


def test_the_journal_is_compacted_as_it_grows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery_store, "COMPACT_MIN_LINES", 16)
    s = RecoveryStore(str(tmp_path))
    for i in range(200):
        s.save(rec(f"c{i % 3}", pid=i))
    lines = (s.dir / JOURNAL).read_bytes().splitlines()
    assert len(lines) < 16 + 3                              # not 200
    assert RecoveryStore(str(tmp_path)).load_all() == [rec("c0", 198), rec("c1", 199), rec("c2", 197)]


def test_records_of_the_old_layout_are_folded_into_the_journal(tmp_path: Path) -> None:
    d = tmp_path / "containers"
    d.mkdir()
    (d / "c1.json").write_bytes(orjson.dumps(rec("c1", 7)))
    (d / "bad.json").write_text("{not json")
    (d / "c1.exitcode").write_text("3\n")
    s = RecoveryStore(str(tmp_path))
    assert s.load_all() == [rec("c1", 7)] and s.read_exit_code("c1") == 3
    assert not list(d.glob("*.json"))                       # folded in, not read twice
    assert RecoveryStore(str(tmp_path)).load_all() == [rec("c1", 7)]
