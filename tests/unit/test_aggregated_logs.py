"""Log aggregation's file format, reader, planner and settings (protocol/aggregated_logs.py,
nodemanager/log_aggregation.py, the NM's config checks) without daemons."""
from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nodemanager import node_settings
from nodemanager.container import Container
from nodemanager.container_manager import ContainerManager
from nodemanager.container_state import ContainerEvent as E
from nodemanager.enforcement import Enforcement
from nodemanager.log_aggregation import LocalLogFile, LogAggregationPlanner
from nodemanager.log_aggregation_service import LogAggregationService, local_log_files
from nodemanager.recovery_store import RecoveryStore
from protocol.aggregated_logs import (MAGIC, READ_PIECE_BYTES, TRAILER_SIZE, AggregatedLogError, ChunkSource,
                                      LogFileWriter, RemoteLogDir, app_node_logs, find_container, iter_log,
                                      node_file_name, parse_file_name, read_chunk, read_index, read_log,
                                      roll_file_name)
from protocol.config import ClusterConfig, ConfigError, NMConfig
from protocol.records import Resource

REPO = Path(__file__).resolve().parents[2]
APP = "application_1700000000000_0007"
C1 = "container_1700000000000_0007_01_000001"
C2 = "container_1700000000000_0007_01_000002"
NODE = "127.0.0.1:45454"


def _logs(tmp_path: Path, files: dict[tuple[str, str], bytes]) -> dict[tuple[str, str], Path]:
    out = {}
    for (cid, name), data in files.items():
        p = tmp_path / "local" / APP / cid / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        out[(cid, name)] = p
    return out


def _write(store: RemoteLogDir, name: str, sources: list[ChunkSource], kind: str = "final", seq: int = 0) -> None:
    w = LogFileWriter(APP, NODE, kind, seq, 1234, sources, user="alice")  # type: ignore[arg-type]
    store.write(APP, name, w.pieces())
    assert w.index is not None and len(w.index.chunks) == len(sources)


def test_round_trip_keeps_every_containers_files_and_index(tmp_path: Path) -> None:
    big = os.urandom(3 << 20)       # over the writer's 1 MiB read piece
    paths = _logs(tmp_path, {(C1, "stdout"): b"hello\n", (C1, "stderr"): b"", (C2, "stdout"): big})
    store = RemoteLogDir(str(tmp_path / "remote"))
    _write(store, node_file_name(NODE), [ChunkSource(c, n, str(p), 0, p.stat().st_size) for (c, n), p in paths.items()])

    assert store.names(APP) == ["127.0.0.1_45454"]
    ix = store.index(APP, "127.0.0.1_45454")
    assert (ix.app_id, ix.node_id, ix.kind, ix.user) == (APP, NODE, "final", "alice")
    assert sorted((c.container_id, c.file_name, c.length) for c in ix.chunks) == [
        (C1, "stderr", 0), (C1, "stdout", 6), (C2, "stdout", len(big))]
    [node] = app_node_logs(store, APP)
    assert node.final and node.node_id == NODE and not node.errors
    assert node.containers() == {C1: {"stdout": 6, "stderr": 0}, C2: {"stdout": len(big)}}
    assert read_log(store, APP, node, C2, "stdout") == big
    assert read_log(store, APP, node, C1, "stdout") == b"hello\n"
    found = find_container(store, C1)
    assert found is not None and found[1] == {"stdout": 6, "stderr": 0}
    assert find_container(store, "container_1700000000000_0008_01_000001") is None
    assert find_container(store, "not-a-container") is None


def test_rolls_are_read_in_order_and_a_final_file_wins(tmp_path: Path) -> None:
    p = _logs(tmp_path, {(C1, "stdout"): b"one\ntwo\nthree\n"})[(C1, "stdout")]
    store = RemoteLogDir(str(tmp_path / "remote"))
    _write(store, roll_file_name(NODE, 1), [ChunkSource(C1, "stdout", str(p), 0, 4)], "roll", 1)
    _write(store, roll_file_name(NODE, 2), [ChunkSource(C1, "stdout", str(p), 4, 4)], "roll", 2)
    [node] = app_node_logs(store, APP)
    assert not node.final and [ix.seq for _, ix in node.files] == [1, 2]
    assert read_log(store, APP, node, C1, "stdout") == b"one\ntwo\n"
    # A lost roll is a marked gap, not silently joined text.
    store.remove(APP, roll_file_name(NODE, 1))
    [node] = app_node_logs(store, APP)
    text = read_log(store, APP, node, C1, "stdout")
    assert text.startswith(b"\n[elastane: bytes 0..4 of this log are missing") and text.endswith(b"two\n")
    _write(store, node_file_name(NODE), [ChunkSource(C1, "stdout", str(p), 0, 14)])
    [node] = app_node_logs(store, APP)
    assert node.final and read_log(store, APP, node, C1, "stdout") == b"one\ntwo\nthree\n"
    assert parse_file_name("127.0.0.1_45454.roll000002") == ("127.0.0.1_45454", 2)
    assert parse_file_name("127.0.0.1_45454") == ("127.0.0.1_45454", 0)


def _one_file(tmp_path: Path) -> tuple[RemoteLogDir, Path]:
    p = _logs(tmp_path, {(C1, "stdout"): b"x" * 1000})[(C1, "stdout")]
    store = RemoteLogDir(str(tmp_path / "remote"))
    _write(store, node_file_name(NODE), [ChunkSource(C1, "stdout", str(p), 0, 1000)])
    return store, Path(store.path(APP, node_file_name(NODE)))


def _index_of(path: Path) -> None:
    with open(path, "rb") as f:
        read_index(f, path.stat().st_size, str(path))


@pytest.mark.parametrize("cut", [1, TRAILER_SIZE, 500, 1001])
def test_a_file_cut_short_is_refused_naming_it(tmp_path: Path, cut: int) -> None:
    _, path = _one_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-cut])
    with pytest.raises(AggregatedLogError, match=r"127\.0\.0\.1_45454.*(cut short|too short|trailer)"):
        _index_of(path)


def test_corrupt_bytes_index_or_header_are_refused(tmp_path: Path) -> None:
    store, path = _one_file(tmp_path)
    good = path.read_bytes()
    # A flipped data byte: the index still reads, the chunk does not.
    path.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    ix = store.index(APP, node_file_name(NODE))
    with open(path, "rb") as f, pytest.raises(AggregatedLogError, match=f"{C1}/stdout do not match their checksum"):
        read_chunk(f, ix.chunks[0], str(path))
    # A flipped index byte.
    offset = struct.unpack(">Q", good[-TRAILER_SIZE:-TRAILER_SIZE + 8])[0]
    path.write_bytes(good[:offset + 3] + bytes([good[offset + 3] ^ 1]) + good[offset + 4:])
    with pytest.raises(AggregatedLogError, match="index does not match its checksum"):
        _index_of(path)
    # Not our format at all.
    path.write_bytes(b"PK\x03\x04" + good[4:])
    with pytest.raises(AggregatedLogError, match="bad header magic"):
        _index_of(path)
    # An index whose CRC matches but whose chunk points past the data.
    bad = msgspec.json.encode({"app_id": APP, "node_id": NODE, "kind": "final", "seq": 0, "written_ms": 1,
                               "chunks": [{"container_id": C1, "file_name": "stdout", "offset": 8, "length": 10 ** 6,
                                           "start": 0, "crc32": 0}]})
    path.write_bytes(MAGIC + bad + struct.pack(">QQI8s", len(MAGIC), len(bad), zlib.crc32(bad), b"ELAGEND1"))
    with pytest.raises(AggregatedLogError, match="outside the data"):
        _index_of(path)


def test_a_refused_file_is_reported_and_the_rolls_serve_instead(tmp_path: Path) -> None:
    p = _logs(tmp_path, {(C1, "stdout"): b"abcdef"})[(C1, "stdout")]
    store = RemoteLogDir(str(tmp_path / "remote"))
    _write(store, roll_file_name(NODE, 1), [ChunkSource(C1, "stdout", str(p), 0, 6)], "roll", 1)
    Path(store.path(APP, node_file_name(NODE))).write_bytes(b"ELAGLOG1 half an upload")
    [node] = app_node_logs(store, APP)
    assert len(node.errors) == 1 and "127.0.0.1_45454" in node.errors[0]
    assert read_log(store, APP, node, C1, "stdout") == b"abcdef"


def test_the_remote_dir_must_be_absolute_or_a_known_scheme() -> None:
    with pytest.raises(AggregatedLogError, match="remote_app_log_dir.*not an absolute path"):
        RemoteLogDir("relative/logs")
    with pytest.raises(AggregatedLogError, match="remote_app_log_dir.*nosuchfs://"):
        RemoteLogDir("nosuchfs://bucket/logs")


def test_memory_url_goes_through_fsspec(tmp_path: Path) -> None:
    p = _logs(tmp_path, {(C1, "stdout"): b"via fsspec\n"})[(C1, "stdout")]
    store = RemoteLogDir(f"memory://h3-agg-{os.getpid()}")
    assert store.local is None
    _write(store, node_file_name(NODE), [ChunkSource(C1, "stdout", str(p), 0, 11)])
    [node] = app_node_logs(store, APP)
    assert read_log(store, APP, node, C1, "stdout") == b"via fsspec\n"
    store.remove(APP, node_file_name(NODE))
    assert store.names(APP) == []


def test_an_fsspec_upload_that_fails_midway_leaves_no_file(tmp_path: Path) -> None:
    """A source that breaks mid-write: fsspec commits what its file got when the block is left, so
    the half-written object stood as the file; it is removed and the error goes on."""
    p = _logs(tmp_path, {(C1, "stdout"): b"0123456789"})[(C1, "stdout")]
    store = RemoteLogDir(f"memory://h3-agg-cut-{os.getpid()}")
    w = LogFileWriter(APP, NODE, "final", 0, 1234, [ChunkSource(C1, "stdout", str(p), 0, 10)], user="alice")

    def cut_short() -> Any:
        pieces = w.pieces()
        yield next(pieces)
        raise FileNotFoundError("the container's log went away")
    with pytest.raises(FileNotFoundError):
        store.write(APP, node_file_name(NODE), cut_short())
    assert store.names(APP) == []


def test_a_restarted_nm_removes_its_unreadable_roll_and_still_uploads_the_final_file(tmp_path: Path) -> None:
    """A roll cut short by a crash mid-upload: the restarted NM's recovery refused it on every tick,
    so the app's final upload never came and its local logs were held for ever. It goes now, and
    the final file carries every byte."""
    _logs(tmp_path, {(C1, "stdout"): b"all of it\n"})
    store = RemoteLogDir(str(tmp_path / "remote"))
    good = tmp_path / "good-roll"
    RemoteLogDir(str(good)).write(APP, "x", LogFileWriter(APP, NODE, "roll", 1, 1234, [
        ChunkSource(C1, "stdout", str(tmp_path / "local" / APP / C1 / "stdout"), 0, 4)], user="alice").pieces())
    cut = (good / APP / "x").read_bytes()[:-TRAILER_SIZE]          # no trailer: cut short
    (tmp_path / "remote" / APP).mkdir(parents=True)
    (tmp_path / "remote" / APP / roll_file_name(NODE, 1)).write_bytes(cut)
    svc = LogAggregationService(store, str(tmp_path / "local"), NODE, LogAggregationPlanner(5.0, 0.0),
                                lambda: {APP: "alice"}, clock=lambda: 1000.0)
    svc.app_finished(APP)
    asyncio.run(svc.run_once())
    assert store.names(APP) == [node_file_name(NODE)]
    [node] = app_node_logs(store, APP)
    assert read_log(store, APP, node, C1, "stdout") == b"all of it\n" and not svc.holds(APP)


# ===== the planner ================================================================================

def _files(**sizes: int) -> list[LocalLogFile]:
    return [LocalLogFile(C1, n, f"/logs/{n}", s) for n, s in sizes.items()]


def test_planner_rolls_new_bytes_each_interval_then_uploads_whole_files_at_the_end() -> None:
    p = LogAggregationPlanner(roll_interval_s=10.0, retention_s=30.0)
    st = p.seen(APP, "alice", now=100.0)
    assert p.next_upload(st, _files(stdout=5), now=105.0) is None           # not one interval yet
    up = p.next_upload(st, _files(stdout=5, stderr=0), now=110.0)
    assert up is not None and (up.kind, up.seq) == ("roll", 1)
    assert [(s.file_name, s.start, s.length) for s in up.sources] == [("stdout", 0, 5)]
    p.uploaded(up, now=110.5)
    assert p.next_upload(st, _files(stdout=5), now=121.0) is None            # nothing new: no upload
    up = p.next_upload(st, _files(stdout=9, stderr=2), now=131.0)
    assert up is not None and up.seq == 2
    assert [(s.file_name, s.start, s.length) for s in up.sources] == [("stdout", 5, 4), ("stderr", 0, 2)]
    p.uploaded(up, now=131.0)
    p.finished(APP, "alice", now=140.0)
    assert p.holds(APP, now=140.0)
    up = p.next_upload(st, _files(stdout=12, stderr=2), now=140.0)
    assert up is not None and up.kind == "final"
    assert [(s.file_name, s.start, s.length) for s in up.sources] == [("stdout", 0, 12), ("stderr", 0, 2)]
    p.uploaded(up, now=141.0)
    assert p.next_upload(st, _files(stdout=12), now=200.0) is None
    assert p.holds(APP, now=170.0) and p.to_free(now=170.0) == []
    assert p.to_free(now=171.0) == [APP] and not p.holds(APP, now=171.0)
    p.freed(APP)
    assert p.forget({APP}) == [] and p.forget(set()) == [APP] and p.apps == {}


def test_planner_backs_off_failed_uploads_and_never_frees_unuploaded_logs() -> None:
    p = LogAggregationPlanner(roll_interval_s=0.0, retention_s=0.0)
    st = p.seen(APP, "", now=0.0)
    assert p.next_upload(st, _files(stdout=5), now=10 ** 6) is None          # no rolling
    p.finished(APP, "alice", now=50.0)
    up = p.next_upload(st, _files(stdout=5), now=50.0)
    assert up is not None and st.user == "alice"
    assert [p.failed(up, now=50.0) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert p.next_upload(st, _files(stdout=5), now=109.0) is None and p.next_upload(st, _files(stdout=5), now=110.0)
    assert p.holds(APP, now=10 ** 6) and p.to_free(now=10 ** 6) == []
    p.uploaded(up, now=111.0)
    assert p.to_free(now=111.0) == [APP]


def test_planner_recovers_a_restarted_nodes_rolls_from_the_remote(tmp_path: Path) -> None:
    p = _logs(tmp_path, {(C1, "stdout"): b"0123456789"})[(C1, "stdout")]
    store = RemoteLogDir(str(tmp_path / "remote"))
    _write(store, roll_file_name(NODE, 3), [ChunkSource(C1, "stdout", str(p), 0, 7)], "roll", 3)
    planner = LogAggregationPlanner(roll_interval_s=1.0, retention_s=0.0)
    st = planner.seen(APP, "alice", now=0.0)
    planner.recover(APP, [store.index(APP, roll_file_name(NODE, 3))])
    up = planner.next_upload(st, [LocalLogFile(C1, "stdout", str(p), 10)], now=1.0)
    assert up is not None and up.seq == 4 and [(s.start, s.length) for s in up.sources] == [(7, 3)]


def test_service_uploads_rolls_then_the_final_file_and_frees_the_local_copy(tmp_path: Path) -> None:
    paths = _logs(tmp_path, {(C1, "stdout"): b"early\n"})
    store = RemoteLogDir(str(tmp_path / "remote"))
    now = [1000.0]
    svc = LogAggregationService(store, str(tmp_path / "local"), NODE, LogAggregationPlanner(5.0, 0.0),
                                lambda: {APP: "alice"}, clock=lambda: now[0])

    async def go() -> None:
        await svc.run_once()
        assert store.names(APP) == []
        now[0] += 5
        await svc.run_once()
        assert store.names(APP) == [roll_file_name(NODE, 1)]
        with open(paths[(C1, "stdout")], "ab") as f:
            f.write(b"late\n")
        svc.app_finished(APP)
        assert svc.holds(APP)
        await svc.run_once()
    asyncio.run(go())
    assert store.names(APP) == [node_file_name(NODE)]       # the roll went once the final file was up
    [node] = app_node_logs(store, APP)
    assert read_log(store, APP, node, C1, "stdout") == b"early\nlate\n"
    assert not (tmp_path / "local" / APP).exists() and not svc.holds(APP)
    assert local_log_files(str(tmp_path / "local"), APP) == []


def test_an_app_that_ends_while_its_dir_is_listed_for_a_roll_gets_its_last_bytes_aggregated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app ends (its containers' last lines written, stop_app telling the service) while a roll's
    listing runs in its thread: the final upload is built from a listing taken after the end."""
    import nodemanager.log_aggregation_service as service_mod   # noqa: PLC0415
    paths = _logs(tmp_path, {(C1, "stdout"): b"early\n"})
    store = RemoteLogDir(str(tmp_path / "remote"))
    now = [1000.0]
    svc = LogAggregationService(store, str(tmp_path / "local"), NODE, LogAggregationPlanner(5.0, 0.0),
                                lambda: {APP: "alice"}, clock=lambda: now[0])
    ending = [False]

    def listing(log_dir: str, app_id: str) -> list[LocalLogFile]:
        files = local_log_files(log_dir, app_id)
        if ending[0]:       # meanwhile: the last words, then the app's end
            ending[0] = False
            with open(paths[(C1, "stdout")], "ab") as f:
                f.write(b"last words\n")
            svc.app_finished(APP)
        return files
    monkeypatch.setattr(service_mod, "local_log_files", listing)

    async def go() -> None:
        await svc.run_once()
        now[0] += 5
        ending[0] = True
        await svc.run_once()
    asyncio.run(go())
    [node] = app_node_logs(store, APP)
    assert read_log(store, APP, node, C1, "stdout") == b"early\nlast words\n"


# ===== settings ===================================================================================

def test_bad_roll_interval_retention_or_remote_dir_are_refused_naming_the_setting() -> None:
    on = ClusterConfig(secret="s", remote_app_log_dir="/srv/logs")
    node_settings.validate(NMConfig(log_roll_interval_s=3600.0), on)
    node_settings.validate(NMConfig(log_roll_interval_s=0.0, keep_finished_logs_s=0.0), on)
    for cfg, cluster, field in (
            (NMConfig(log_roll_interval_s=-1.0), on, "log_roll_interval_s"),
            (NMConfig(log_roll_interval_s=0.5), on, "log_roll_interval_s"),
            (NMConfig(log_roll_interval_s=float("nan")), on, "log_roll_interval_s"),
            (NMConfig(log_roll_interval_s=float("inf")), on, "log_roll_interval_s"),
            (NMConfig(log_roll_interval_s=60.0), ClusterConfig(secret="s"), "log_roll_interval_s.*remote_app_log_dir"),
            (NMConfig(keep_finished_logs_s=-5.0), on, "keep_finished_logs_s"),
            (NMConfig(keep_finished_logs_s=float("nan")), on, "keep_finished_logs_s"),
            (NMConfig(), ClusterConfig(secret="s", remote_app_log_dir="logs/rel"), "remote_app_log_dir"),
            (NMConfig(), ClusterConfig(secret="s", remote_app_log_dir="nosuchfs://b/x"), "remote_app_log_dir")):
        with pytest.raises(ConfigError, match=field):
            node_settings.validate(cfg, cluster)


def test_the_nm_stops_at_start_on_a_bad_roll_interval(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'[cluster]\nsecret = "{"ab" * 16}"\nremote_app_log_dir = "{tmp_path / "remote"}"\n')
    nm = tmp_path / "nm.toml"
    nm.write_text("[nm]\nlog_roll_interval_s = 0.25\n")
    r = subprocess.run([sys.executable, "-m", "nodemanager", "--config", str(nm), "--cluster-config", str(cluster),
                        "--port", "0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "log_roll_interval_s must be 0" in r.stderr, r.stderr
    nm.write_text("[nm]\nkeep_finished_logs_s = -1.0\n")
    r = subprocess.run([sys.executable, "-m", "nodemanager", "--config", str(nm), "--cluster-config", str(cluster),
                        "--port", "0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "keep_finished_logs_s" in r.stderr, r.stderr


async def test_the_container_manager_keeps_logs_aggregation_holds_and_says_when_an_app_ends(tmp_path: Path) -> None:
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"), keep_finished_logs_s=0.0)
    m = ContainerManager(cfg, NODE, "127.0.0.1", 1, Resource(1024, 2), Enforcement(None),
                         RecoveryStore(cfg.recovery_dir), clock=lambda: 100.0)
    held = {APP}
    ended: list[str] = []
    m.logs_held = lambda app_id: app_id in held
    m.on_app_finished = ended.append
    c = Container(C1, APP, "", "alice", Resource(128, 1), 0.0, str(tmp_path / "local" / APP / C1),
                  str(tmp_path / "logs" / APP / C1), m.store.exit_file(C1))
    for e in (E.LOCALIZED, E.LAUNCHED, E.EXITED_SUCCESS, E.CLEANED_UP):
        c.apply(e)
    c.finished_at, c.reported = 10.0, True
    os.makedirs(c.log_dir)
    m.containers[C1] = c
    assert m.expire_finished(100.0) == [] and os.path.isdir(c.log_dir)      # not aggregated yet
    await m.stop_app(APP)
    assert ended == [APP]
    held.clear()
    assert m.expire_finished(100.0) == [C1] and not os.path.exists(c.log_dir)
    m.store.close()


def test_a_long_lived_reader_sees_files_another_process_wrote_and_removed_on_s3(s3: Any) -> None:
    """The RM lists an app's logs while it runs (its rolls), then again once an NM -- another
    process, with its own s3fs -- has put the final file up and removed the rolls: the second
    listing is the store's, not the first one kept (s3fs caches listings per process)."""
    import s3fs  # noqa: PLC0415  # only with the S3 extra (the fixture skips without it)
    reader = RemoteLogDir(s3.url("app-logs"))
    reader.write(APP, "10.0.0.1_8042.roll000001", [b"log"])
    assert reader.names(APP) == ["10.0.0.1_8042.roll000001"]
    nm = s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": s3.endpoint_url})
    nm.pipe(reader.path(APP, "10.0.0.1_8042"), b"final")
    nm.rm_file(reader.path(APP, "10.0.0.1_8042.roll000001"))
    assert reader.names(APP) == ["10.0.0.1_8042"]


def test_the_tail_of_a_big_log_is_read_without_holding_the_log(tmp_path: Path) -> None:
    """`start=-10` of a 16 MiB log: the last ten bytes, with the reader's memory a piece's, not the
    log's (the RM's and NMs' log pages read this way; what a tail fetches from a store:
    test_aggregated_log_reads_bounded.py)."""
    import tracemalloc  # noqa: PLC0415

    big = bytes(range(256)) * (1 << 16)                # 16 MiB
    p = _logs(tmp_path, {(C1, "stdout"): big})[(C1, "stdout")]
    store = RemoteLogDir(str(tmp_path / "remote"))
    _write(store, node_file_name(NODE), [ChunkSource(C1, "stdout", str(p), 0, len(big))])
    [node] = app_node_logs(store, APP)
    tracemalloc.start()
    try:
        tail = read_log(store, APP, node, C1, "stdout", start=-10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tail == big[-10:] and peak < 4 << 20
    assert read_log(store, APP, node, C1, "stdout", start=len(big) - 3) == big[-3:]
    assert read_log(store, APP, node, C1, "stdout", start=-(len(big) + 5)) == big    # more than there is: all
    assert read_log(store, APP, node, C1, "stdout", start=len(big) + 5) == b""


def test_iter_log_gives_read_logs_bytes_in_bounded_pieces_and_closes_its_file(tmp_path: Path) -> None:
    """The RM's and NMs' log calls stream iter_log: pieces of at most READ_PIECE_BYTES (a gap
    marked between the rolls), read_log's bytes once joined; closed early, the file it reads is closed."""
    big = bytes(range(256)) * (3 * READ_PIECE_BYTES // 256 + 7)
    p = _logs(tmp_path, {(C1, "stdout"): big})[(C1, "stdout")]
    store = RemoteLogDir(str(tmp_path / "remote"))
    _write(store, roll_file_name(NODE, 1), [ChunkSource(C1, "stdout", str(p), 0, 100)], kind="roll", seq=1)
    _write(store, roll_file_name(NODE, 2), [ChunkSource(C1, "stdout", str(p), 200, len(big) - 200)], kind="roll", seq=2)
    [node] = app_node_logs(store, APP)
    for start in (0, 50, 150, -10, -(len(big) - 300), len(big)):
        pieces = list(iter_log(store, APP, node, C1, "stdout", start))
        assert all(0 < len(piece) <= READ_PIECE_BYTES for piece in pieces), start
        assert b"".join(pieces) == read_log(store, APP, node, C1, "stdout", start), start
    text = b"".join(iter_log(store, APP, node, C1, "stdout"))
    assert text == big[:100] + b"\n[elastane: bytes 100..200 of this log are missing from the aggregated files]\n" + big[200:]
    opened = []
    real_open = store.open

    def tracking_open(app_id: str, name: str) -> Any:
        f, size = real_open(app_id, name)
        opened.append(f)
        return f, size
    store.open = tracking_open  # type: ignore[method-assign]
    it = iter_log(store, APP, node, C1, "stdout", 300)
    assert next(it) == big[300:200 + READ_PIECE_BYTES]      # pieces are read from the chunk's start
    assert [f.closed for f in opened] == [True, False]          # the first roll read through, the second open
    it.close()
    assert [f.closed for f in opened] == [True, True]
