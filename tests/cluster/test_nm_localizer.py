"""The NM's localizer: the pure cache bookkeeping, fetch and unpack checks, scopes and the cache on a
container manager in process, and a real NM launching a container that reads its local resources."""
from __future__ import annotations

import asyncio
import io
import os
import tarfile
import threading
import zipfile
from pathlib import Path

import fsspec
import msgspec
import pytest

from protocol import internal_api as api, tokens
from protocol.config import NMConfig
from protocol.local_resources import LocalResource
from protocol.nm_client import NMClient
from protocol.records import ExitStatus, Resource
from protocol.remote_exception import BadRequest

from nodemanager import localizer as loc
from nodemanager.container_manager import ContainerManager
from nodemanager.container_state import NMContainerState as S
from nodemanager.enforcement import Enforcement
from nodemanager.localizer_cache import Acquired, CacheBook, CacheKey
from nodemanager.recovery_store import RecoveryStore
from rm import submission
from polling import async_wait_until
from nm_harness import SECRET, FakeNodeRM, container_token, new_ids, start_nm, stop_nm

pytestmark = pytest.mark.timeout(120)


def mtime_ms(p: Path) -> int:
    return os.stat(p).st_mtime_ns // 1_000_000


def make_tar(path: Path, files: dict[str, bytes], gz: bool = True) -> Path:
    with tarfile.open(path, "w:gz" if gz else "w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def make_zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def key(url: str, scope: str = "PUBLIC", owner: str = "") -> CacheKey:
    return CacheKey(scope, owner, url, "FILE", "", -1, -1)  # type: ignore[arg-type]


# ----- the pure bookkeeping ----------------------------------------------------------------------

def test_book_fetches_once_and_waiters_share_it():
    b = CacheBook(bound_bytes=100)
    k = key("file:///a")
    assert b.acquire(k) is Acquired.FETCH
    assert b.acquire(k) is Acquired.WAIT          # a second request while the first fetches
    assert b.fetched(k, 10) == []
    assert b.acquire(k) is Acquired.HIT
    assert b.get(k).refs == 3


def test_book_evicts_least_recently_used_idle_entries_over_the_bound():
    b = CacheBook(bound_bytes=100)
    a, c, d = key("file:///a"), key("file:///c"), key("file:///d", "PRIVATE", "bob")
    for k in (a, c):
        b.acquire(k)
        assert b.fetched(k, 40) == []
    assert b.release(a) == [] and b.release(c) == []   # 80 <= 100: both kept, idle
    b.acquire(d)
    assert b.fetched(d, 40) == [a]                # 120 > 100: the least recently released idle one
    assert b.bounded_bytes() == 80
    b.acquire(c)                                   # in use again: never evicted
    big = key("file:///big")
    b.acquire(big)
    assert b.fetched(big, 500) == []               # everything else is in use: over the bound for now
    assert b.release(d) == [d]
    assert b.release(big) == [big]                 # released, still over: goes too
    assert set(b.entries) == {c}


def test_book_application_entries_are_unbounded_and_go_with_their_app():
    b = CacheBook(bound_bytes=0)
    k = key("file:///x", "APPLICATION", "application_1_0001")
    other = key("file:///x", "APPLICATION", "application_1_0002")
    for kk in (k, other):
        b.acquire(kk)
        assert b.fetched(kk, 10) == []
    assert b.release(k) == []
    assert b.drop_app("application_1_0001") == [k] and set(b.entries) == {other}


def test_book_failed_fetch_drops_the_entry_and_its_waiters():
    b = CacheBook(bound_bytes=100)
    k = key("file:///a")
    b.acquire(k)
    b.acquire(k)
    b.fetch_failed(k)
    assert b.get(k) is None and b.acquire(k) is Acquired.FETCH   # the next request tries again


# ----- fetch and unpack ---------------------------------------------------------------------------

def test_file_size_and_timestamp_checks_name_what_changed(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("hello")
    ok = LocalResource(str(src), size=5, timestamp=mtime_ms(src))
    loc.fetch(ok, str(tmp_path / "out"))
    assert (tmp_path / "out").read_text() == "hello"
    with pytest.raises(loc.LocalizationError, match="size is 5 bytes, the resource says 4"):
        loc.fetch(LocalResource(f"file://{src}", size=4), str(tmp_path / "o2"))
    with pytest.raises(loc.LocalizationError, match="modification time is .* the resource says 123"):
        loc.fetch(LocalResource(str(src), timestamp=123), str(tmp_path / "o3"))


def test_archives_unpack_tar_gz_tar_and_zip(tmp_path):
    files = {"pkg/mod.py": b"X = 1\n", "data.txt": b"d"}
    for arch in (make_tar(tmp_path / "a.tgz", files), make_tar(tmp_path / "a.tar", files, gz=False),
                 make_zip(tmp_path / "a.zip", files)):
        dest = tmp_path / f"out-{arch.name}"
        loc.fetch(LocalResource(str(arch), type="ARCHIVE"), str(dest))
        assert (dest / "pkg" / "mod.py").read_bytes() == b"X = 1\n" and (dest / "data.txt").read_bytes() == b"d"


def test_pattern_keeps_only_matching_members(tmp_path):
    arch = make_zip(tmp_path / "lib.jar", {"a/x.py": b"1", "a/y.txt": b"2", "b/z.py": b"3"})
    dest = tmp_path / "out"
    loc.fetch(LocalResource(str(arch), type="PATTERN", pattern=r".*\.py"), str(dest))
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == ["a/x.py", "b/z.py"]


@pytest.mark.parametrize("member,why", [("../evil.txt", "'..' in its path"), ("/etc/evil", "absolute path"),
                                        ("ok/../../evil", "'..' in its path")])
def test_archive_members_escaping_the_dir_are_refused(tmp_path, member, why):
    arch = make_tar(tmp_path / "bad.tgz", {"fine.txt": b"f", member: b"x"})
    with pytest.raises(loc.LocalizationError, match=why) as ei:
        loc.fetch(LocalResource(str(arch), type="ARCHIVE"), str(tmp_path / "out"))
    assert repr(member) in str(ei.value)
    assert not (tmp_path / "evil.txt").exists()


def test_tar_symlink_out_of_the_dir_is_refused(tmp_path):
    arch = tmp_path / "link.tar"
    with tarfile.open(arch, "w") as tf:
        info = tarfile.TarInfo("up")
        info.type, info.linkname = tarfile.SYMTYPE, "../../outside"
        tf.addfile(info)
    with pytest.raises(loc.LocalizationError, match="'up' is a symlink to '../../outside'"):
        loc.fetch(LocalResource(str(arch), type="ARCHIVE"), str(tmp_path / "out"))
    (tmp_path / "plain.txt").write_text("not an archive")
    with pytest.raises(loc.LocalizationError, match="not a tar or zip archive"):
        loc.fetch(LocalResource(str(tmp_path / "plain.txt"), type="ARCHIVE"), str(tmp_path / "o"))


def _link_tar(path, entries):
    """A tar of (name, symlink target or None for a file with bytes b"x") entries, in order."""
    with tarfile.open(path, "w") as tf:
        for name, target in entries:
            info = tarfile.TarInfo(name)
            if target is None:
                info.size = 1
                tf.addfile(info, io.BytesIO(b"x"))
            else:
                info.type, info.linkname = tarfile.SYMTYPE, target
                tf.addfile(info)
    return path


@pytest.mark.parametrize("entries, needle", [
    # a file written through a link the archive made (the last step of the published escapes)
    ([("d", None), ("sub", "d"), ("sub/pwned", None)], "'sub/pwned' lies under 'sub', a symlink in the archive"),
    # a link chained through another link: its text stays inside, where it resolves need not
    ([("a/b", None), ("l", "a"), ("escape", "l/..")], "'escape' is a symlink to 'l/..', which goes through another symlink"),
])
def test_tar_members_through_the_archives_own_symlinks_are_refused(tmp_path, entries, needle):
    arch = _link_tar(tmp_path / "chain.tar", entries)
    with pytest.raises(loc.LocalizationError, match=needle):
        loc.fetch(LocalResource(str(arch), type="ARCHIVE"), str(tmp_path / "out"))
    assert not (tmp_path / "pwned").exists()


def test_tar_symlinks_within_the_dir_still_unpack(tmp_path):
    arch = _link_tar(tmp_path / "ok.tar", [("lib/python3.11", None), ("bin/python3", "../lib/python3.11"),
                                           ("bin/python", "python3")])       # a venv's link to a link
    out = tmp_path / "out"
    loc.fetch(LocalResource(str(arch), type="ARCHIVE"), str(out))
    assert (out / "bin" / "python").read_bytes() == b"x" and (out / "bin" / "python").is_symlink()


def test_memory_url_proves_a_non_local_scheme(tmp_path):
    fs = fsspec.filesystem("memory")
    fs.pipe("/loc-test/model.cfg", b"lr=0.1")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("w/weights.bin")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    fs.pipe("/loc-test/bundle.tgz", buf.getvalue())
    loc.fetch(LocalResource("memory://loc-test/model.cfg", size=6), str(tmp_path / "cfg"))
    assert (tmp_path / "cfg").read_bytes() == b"lr=0.1"
    loc.fetch(LocalResource("memory://loc-test/bundle.tgz", type="ARCHIVE"), str(tmp_path / "b"))
    assert (tmp_path / "b" / "w" / "weights.bin").read_bytes() == b"abc"
    assert not (tmp_path / "b.download").exists()
    with pytest.raises(loc.LocalizationError, match="size is 6 bytes"):
        loc.fetch(LocalResource("memory://loc-test/model.cfg", size=7), str(tmp_path / "cfg2"))


# ----- the localizer on a container manager, in process -------------------------------------------

def _manager(tmp_path: Path, **cfg_kw) -> ContainerManager:
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"), **cfg_kw)
    return ContainerManager(cfg, "127.0.0.1:1", "127.0.0.1", 1, Resource(4096, 8), Enforcement(None),
                            RecoveryStore(cfg.recovery_dir))


async def _run(m: ContainerManager, resources: dict[str, LocalResource], command: str = "true",
               user: str = "alice", app: str | None = None):
    a, attempt, cid = new_ids()
    app = app or a
    cid = cid.replace(a.split("_", 1)[1], app.split("_", 1)[1])
    claims = tokens.verify(SECRET, container_token("127.0.0.1:1", cid, app, attempt, user=user), tokens.CONTAINER)
    c = await m.start(claims, Resource(128, 1), api.LaunchContext(commands=[command], local_resources=resources))
    await async_wait_until(lambda: c.state is S.DONE, what=f"{cid} done")
    return c


async def test_container_sees_each_type_linked_under_its_name(tmp_path):
    m = _manager(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    arch = make_tar(src / "deps.tar.gz", {"lib/util.py": b"U = 2\n"})
    jar = make_zip(src / "lib.jar", {"keep/a.py": b"a", "drop/b.txt": b"b"})
    res = {"train.py": LocalResource(str(src / "train.py"), size=(src / "train.py").stat().st_size,
                                     timestamp=mtime_ms(src / "train.py")),
           "deps": LocalResource(f"file://{arch}", type="ARCHIVE", visibility="PRIVATE"),
           "jar": LocalResource(str(jar), type="PATTERN", pattern=r"keep/.*", visibility="PUBLIC")}
    cmd = ("test -L train.py && grep -q hi train.py && grep -q 'U = 2' deps/lib/util.py "
           "&& test -f jar/keep/a.py && test ! -e jar/drop")
    c = await _run(m, res, cmd)
    assert c.exit_status == 0, c.diagnostics
    local = tmp_path / "local"
    assert len(list((local / "filecache").glob("*.json"))) == 1                       # the jar, PUBLIC
    assert len(list((local / "usercache" / "alice" / "filecache").glob("*.json"))) == 1  # deps, PRIVATE
    assert len(list((local / c.app_id / "filecache").glob("*.json"))) == 1            # train.py
    await m.shutdown()


async def test_bad_sources_fail_the_container_naming_the_resource(tmp_path):
    m = _manager(tmp_path)
    src = tmp_path / "f.txt"
    src.write_text("abc")
    unreadable = tmp_path / "secret.txt"
    unreadable.write_text("x")
    unreadable.chmod(0)
    cases = {"missing": (LocalResource(str(tmp_path / "nope")), "no such file"),
             "changed": (LocalResource(str(src), size=99), "size is 3 bytes, the resource says 99"),
             "evil": (LocalResource(str(make_tar(tmp_path / "e.tgz", {"../x": b"1"})), type="ARCHIVE"),
                      "'..' in its path"),
             "badscheme": (LocalResource("nosuchscheme://bucket/x"), "nosuchscheme")}
    if os.geteuid() != 0:           # root reads anything
        cases["unreadable"] = (LocalResource(str(unreadable)), "permission denied")
    for name, (res, why) in cases.items():
        c = await _run(m, {name: res})
        assert c.exit_status == ExitStatus.INVALID
        assert f"local resource {name!r}" in c.diagnostics and why in c.diagnostics, c.diagnostics
    assert m.used() == Resource(0, 0)
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "local").rglob("*"))  # nothing half-done
    await m.shutdown()


async def test_a_bad_launch_context_entry_is_refused_before_admission(tmp_path):
    m = _manager(tmp_path)
    app, attempt, cid = new_ids()
    claims = tokens.verify(SECRET, container_token("127.0.0.1:1", cid, app, attempt), tokens.CONTAINER)
    for res, why in (({"a/b": LocalResource("/x")}, "one path component"),
                     ({"r": LocalResource("relative/path")}, "neither an absolute path nor a URL"),
                     ({"p": LocalResource("/x.jar", type="PATTERN", pattern="(")}, "bad pattern")):
        with pytest.raises(BadRequest, match=why):
            await m.start(claims, Resource(128, 1), api.LaunchContext(commands=["true"], local_resources=res))
    assert m.containers == {}


async def test_public_resource_is_fetched_once_and_concurrent_requests_share_the_fetch(tmp_path):
    m = _manager(tmp_path)
    arch = make_tar(tmp_path / "big.tgz", {"x/y": b"y" * 1000})
    res = {"big": LocalResource(str(arch), type="ARCHIVE", visibility="PUBLIC")}
    first = await asyncio.gather(*(_run(m, res, "test -f big/x/y") for _ in range(3)))
    assert [c.exit_status for c in first] == [0, 0, 0]
    assert m.localizer.fetches_started == 1
    second = await _run(m, res, "test -f big/x/y", user="bob")     # PUBLIC: another user too
    assert second.exit_status == 0 and m.localizer.fetches_started == 1
    private = {"big": LocalResource(str(arch), type="ARCHIVE", visibility="PRIVATE")}
    await _run(m, private, user="alice")
    await _run(m, private, user="bob")
    assert m.localizer.fetches_started == 3          # PRIVATE: one per user
    await m.shutdown()


async def test_cache_evicts_idle_entries_over_its_bound(tmp_path):
    m = _manager(tmp_path, localizer_cache_mb=1)
    blobs = []
    for i in range(3):
        p = tmp_path / f"blob{i}"
        p.write_bytes(bytes([i]) * (400 * 1024))
        blobs.append(LocalResource(str(p), visibility="PUBLIC"))
    for i, r in enumerate(blobs):
        assert (await _run(m, {f"b{i}": r})).exit_status == 0
    cache = tmp_path / "local" / "filecache"
    # 3 x 400 KB > 1 MB: the least recently used went, from disk too.
    await async_wait_until(lambda: len(list(cache.glob("*.json"))) == 2 and len(
        [p for p in cache.iterdir() if p.is_dir()]) == 2, what="evicted entry removed from disk")
    assert m.localizer.book.bounded_bytes() <= 1024 * 1024
    assert (await _run(m, {"b2": blobs[2]})).exit_status == 0
    assert m.localizer.fetches_started == 3          # still cached
    assert (await _run(m, {"b0": blobs[0]})).exit_status == 0
    assert m.localizer.fetches_started == 4          # evicted: fetched again
    await m.shutdown()


async def test_application_resources_go_with_the_app(tmp_path):
    m = _manager(tmp_path)
    src = tmp_path / "conf.json"
    src.write_text("{}")
    app = new_ids()[0]
    c = await _run(m, {"conf.json": LocalResource(str(src))}, "test -f conf.json", app=app)
    assert c.exit_status == 0
    app_cache = tmp_path / "local" / app / "filecache"
    assert list(app_cache.glob("*.json"))
    await m.stop_app(app)
    await async_wait_until(lambda: not app_cache.exists(), what="app cache removed")
    assert m.localizer.book.entries == {}
    await m.shutdown()


async def test_a_hung_fetch_times_out_and_fails_the_container(tmp_path, monkeypatch):
    m = _manager(tmp_path, localizer_fetch_timeout_s=0.3)
    release = threading.Event()
    real_fetch = loc.fetch

    def stuck(res, target, cancel=None):
        release.wait(10)
        return real_fetch(res, target, cancel)

    monkeypatch.setattr(loc, "fetch", stuck)
    src = tmp_path / "slow"
    src.write_text("s")
    c = await _run(m, {"slow": LocalResource(str(src))})
    release.set()
    assert c.exit_status == ExitStatus.INVALID and "'slow'" in c.diagnostics and "timed out" in c.diagnostics
    await m.shutdown()


async def test_restart_restores_complete_entries_and_drops_partial_ones(tmp_path):
    m = _manager(tmp_path)
    src = tmp_path / "s.txt"
    src.write_text("s")
    await _run(m, {"s": LocalResource(str(src), visibility="PUBLIC")})
    await m.shutdown()
    partial = tmp_path / "local" / "filecache" / ".tmp-abc-123"
    partial.mkdir()
    m2 = _manager(tmp_path)
    await m2.recover()
    assert not partial.exists() and len(m2.localizer.book.entries) == 1
    await _run(m2, {"s": LocalResource(str(src), visibility="PUBLIC")})
    assert m2.localizer.fetches_started == 0
    await m2.shutdown()


# ----- the RM's submission -------------------------------------------------------------------------

def test_rm_submission_validates_local_resources():

    def sub(entries):
        body = {"application-id": "application_1700000000000_0001", "resource": {"memory": 128, "vCores": 1},
                "am-container-spec": {"commands": {"command": "true"}, "local-resources": {"entry": entries}}}
        return submission.validate(msgspec.convert(body, submission.SubmissionContext))

    ok = sub([{"key": "app.py", "value": {"resource": "file:///s/app.py", "type": "FILE",
                                          "visibility": "APPLICATION", "size": 3, "timestamp": 5}}])
    assert ok.am.local_resources["app.py"].size == 3
    one = sub({"key": "a.tgz", "value": {"resource": "/s/a.tgz", "type": "ARCHIVE"}})   # Jersey's bare object
    assert one.am.local_resources["a.tgz"].type == "ARCHIVE"
    for entries, why in (([{"key": "x", "value": {"resource": "/x", "type": "DIR"}}], "'x'"),
                         ([{"key": "x", "value": {"resource": "/x", "sizee": 1}}], "sizee"),
                         ([{"key": "../x", "value": {"resource": "/x"}}], "one path component"),
                         # the NM writes its launch script there: linked, it would write into the cache
                         ([{"key": "launch_container.sh", "value": {"resource": "/x"}}], "writes its launch script"),
                         ([{"key": "p", "value": {"resource": "/x", "type": "PATTERN"}}], "needs a `pattern`"),
                         ([{"key": "x", "value": {"resource": "/x"}}, {"key": "x", "value": {"resource": "/y"}}],
                          "given twice")):
        with pytest.raises(BadRequest, match=why) as ei:
            sub(entries)
        assert "local-resources" in str(ei.value)


# ----- a real NM -------------------------------------------------------------------------------------

async def test_real_nm_container_reads_a_localized_file_and_archive(tmp_path):
    src = tmp_path / "shared"
    src.mkdir()
    (src / "train.py").write_text("print('EPOCHS', 3)\n")
    arch = make_tar(src / "model.tgz", {"model/config.txt": b"layers=4\n"})
    rm = await FakeNodeRM().start()
    nm = await start_nm(tmp_path / "nm", rm, cgroups="off")
    client = NMClient()
    try:
        app, attempt, cid = new_ids()
        res = {"train.py": LocalResource(str(src / "train.py"), size=(src / "train.py").stat().st_size,
                                         timestamp=mtime_ms(src / "train.py")),
               "model": LocalResource(f"file://{arch}", type="ARCHIVE", visibility="PUBLIC")}
        ctx = api.LaunchContext(commands=["python train.py && cat model/model/config.txt"], local_resources=res)
        tok = container_token(nm.node_id, cid, app, attempt)
        await client.start_container(nm.address, tok, ctx)

        async def done():
            s = await client.container_status(nm.address, cid, tok)
            return s if s.state == "COMPLETE" else None
        st = await async_wait_until(done, 30, what="container complete")
        assert st.exit_status == 0, st.diagnostics
        out = (nm.dirs["logs"] / app / cid / "stdout").read_text()
        assert "EPOCHS 3" in out and "layers=4" in out
        # A second container whose archive changed since its entry was made fails, naming it.
        app2, attempt2, cid2 = new_ids()
        bad = {"model": LocalResource(str(arch), type="ARCHIVE", size=1)}
        tok2 = container_token(nm.node_id, cid2, app2, attempt2)
        await client.start_container(nm.address, tok2, api.LaunchContext(commands=["true"], local_resources=bad))

        async def done2():
            s = await client.container_status(nm.address, cid2, tok2)
            return s if s.state == "COMPLETE" else None
        st2 = await async_wait_until(done2, 30, what="bad container complete")
        assert st2.exit_status == ExitStatus.INVALID and "'model'" in st2.diagnostics
    finally:
        await client.close()
        await stop_nm(nm)
        await rm.stop()


def test_the_launch_script_is_never_written_through_a_link(tmp_path):
    """A link planted under the script's name (a resource, a container's own) is replaced, not
    written through: the file it points at keeps its bytes and mode."""
    from nodemanager.launcher import write_launch_script     # noqa: PLC0415
    cached = tmp_path / "cache" / "shared.bin"
    cached.parent.mkdir()
    cached.write_bytes(b"cached bytes")
    cached.chmod(0o644)
    work = tmp_path / "work"
    work.mkdir()
    (work / "launch_container.sh").symlink_to(cached)
    path = write_launch_script(str(work), "#!/bin/bash\ntrue\n")
    assert cached.read_bytes() == b"cached bytes" and cached.stat().st_mode & 0o777 == 0o644
    assert not os.path.islink(path) and open(path).read() == "#!/bin/bash\ntrue\n"
    assert os.stat(path).st_mode & 0o700 == 0o700
