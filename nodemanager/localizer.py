"""The NM's localizer: a container's local resources fetched onto the node and linked into its
working dir before it starts (YARN's ResourceLocalizationService, reduced).

Where things go (`<local_dir>` is NMConfig.local_dir):

    <local_dir>/filecache/<digest>/<name>                   PUBLIC: one copy for the node
    <local_dir>/usercache/<user>/filecache/<digest>/<name>  PRIVATE: one per user
    <local_dir>/<app_id>/filecache/<digest>/<name>          APPLICATION: one per app, removed with it

`<digest>` hashes the resource's URL, type, pattern, size and timestamp; `<name>` is the URL's last
path component; a `<digest>.json` beside the entry says it is complete (an entry without one is a
fetch cut short, removed at start-up). The container's working dir gets a symlink named like the
resource's key to `<name>` (a file, or for ARCHIVE / PATTERN the dir it was unpacked into).

Sources: an absolute path or `file://` (a shared mount), or any fsspec URL (`hdfs://`, `s3://`,
`memory://`...). Checks: YARN's -- a `size` or `timestamp` (mtime, ms) in the entry that differs
from the source's fails the container, naming the resource; archives (tar, tar.gz / tgz / bz2 /
xz, zip) whose members have absolute paths, `..`, links leading out of the dir or device files
are refused, naming the member. PATTERN: the archive is unpacked keeping only the members whose
path matches `pattern` in full (YARN unpacks a jar's matching entries; it also keeps the jar
itself, which Elastane does not).

Fetches run in the localizer's own threads (`localizer_threads`), never on the event loop nor in
the launches' threads; concurrent requests for one resource share one fetch (the bookkeeping is
the pure `localizer_cache.CacheBook`); each fetch is bounded by `localizer_fetch_timeout_s`. A
container that stops waiting (it was stopped) drops only its own reference: the fetch goes on for
the others, and is given up once nobody waits. A fetch given up (timed out, or nobody waits) leaves
the book at once (the next request fetches afresh), but its thread may run on to its next cancel
check: it never touches the entry's dir, which a newer fetch may have made for a running container
(its commit checks the cancel under the key's lock, and on cancel removes only its own temp dir).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import re
import shutil
import stat
import tarfile
import tempfile
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import PurePosixPath
from typing import IO, Any, Iterator, Optional
from urllib.parse import unquote, urlparse

import msgspec

from protocol.config import NMConfig
from protocol.durable_storage import write_atomic
from protocol.local_resources import LocalResource, LocalResourceError, decode_resources

from .localizer_cache import Acquired, CacheBook, CacheKey, EntryState
from protocol.errors import HostError, StateError

log = logging.getLogger(__name__)

MB = 1024 * 1024
CHUNK = 1 * MB


class LocalizationError(HostError, RuntimeError):
    """A resource could not be localized; the message names the resource and the cause."""


class _Cancelled(StateError):
    """The fetch's waiter gave up (timeout, NM shutdown): stop and clean up."""


def validate(resources: dict[str, LocalResource]) -> None:
    """What a launch context's typed decode cannot check (link names, PATTERN's pattern, the URL
    form); LocalResourceError names the entry."""
    decode_resources(msgspec.to_builtins(resources))
    for name, res in resources.items():
        if res.type == "PATTERN":
            try:
                re.compile(res.pattern)
            except re.error as e:
                raise LocalResourceError(f"local resource {name!r}: bad pattern {res.pattern!r}: {e}") from None
        if "://" not in res.resource and not res.resource.startswith("/"):
            raise LocalResourceError(f"local resource {name!r}: {res.resource!r} is neither an absolute "
                                     "path nor a URL")


# ----- fetching (blocking: runs in the localizer's threads) -----------------------------------------

def _local_path(url: str) -> Optional[str]:
    """The path of a local source (an absolute path or file://), else None."""
    if url.startswith("/"):
        return url
    if url.startswith("file://"):
        p = urlparse(url)
        if p.netloc not in ("", "localhost"):
            raise LocalizationError(f"file URL with a host ({p.netloc!r}) is not a local path")
        return unquote(p.path)
    return None


def basename_of(url: str) -> str:
    """The entry's file name: the URL's last path component ("resource" when it has none)."""
    path = urlparse(url).path if "://" in url else url
    name = posixpath.basename(unquote(path).rstrip("/"))
    return name if name not in ("", ".", "..") else "resource"


class _Source:
    """A resource's source: its size, mtime and a byte stream, local or through fsspec."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = _local_path(url)
        self.fs: Any = None
        if self.path is None:
            import fsspec  # type: ignore[import-untyped]  # noqa: PLC0415  # most NMs localize only local files
            try:
                self.fs, self.fs_path = fsspec.core.url_to_fs(url)
            except (ImportError, ValueError) as e:
                raise LocalizationError(f"cannot open {url!r}: {e}") from None

    def check(self, res: LocalResource) -> int:
        """YARN's check: the source must still be what the client saw. Returns the file mode."""
        mtime_ms: Optional[int]
        if self.path is not None:
            st = os.stat(self.path)
            if stat.S_ISDIR(st.st_mode):
                raise LocalizationError("is a directory (a resource is one file or archive)")
            size, mtime_ms, mode = st.st_size, st.st_mtime_ns // 1_000_000, st.st_mode
        else:
            try:
                # s3fs answers info() from a directory listing it cached (this process may have
                # listed the resource's dir before it was staged again): ask the store itself.
                self.fs.invalidate_cache(self.fs_path)
                info = self.fs.info(self.fs_path)
            except FileNotFoundError:
                raise
            except Exception as e:
                raise OSError(f"cannot stat: {e}") from e
            if info.get("type") == "directory":
                raise LocalizationError("is a directory (a resource is one file or archive)")
            size, mtime_ms, mode = int(info.get("size") or 0), self._mtime_ms(info), 0o644
        if res.size >= 0 and size != res.size:
            raise LocalizationError(f"changed since submission: size is {size} bytes, the resource says {res.size}")
        if res.timestamp >= 0:
            if mtime_ms is None:
                raise LocalizationError("its source reports no modification time to check the timestamp against")
            if mtime_ms != res.timestamp:
                raise LocalizationError(f"changed since submission: modification time is {mtime_ms} ms, "
                                        f"the resource says {res.timestamp}")
        return mode

    def _mtime_ms(self, info: dict[str, Any]) -> Optional[int]:
        try:
            dt = self.fs.modified(self.fs_path)
            return int(dt.timestamp() * 1000)
        except Exception:  # not every fsspec filesystem implements modified()
            pass
        for k in ("mtime", "LastModified", "last_modified", "created"):
            v: Any = info.get(k)
            if isinstance(v, (int, float)):
                return int(v * 1000)
            if v is not None and hasattr(v, "timestamp"):
                return int(v.timestamp() * 1000)
        return None

    def open(self) -> IO[bytes]:
        if self.path is not None:
            return open(self.path, "rb")
        f: IO[bytes] = self.fs.open(self.fs_path, "rb")
        return f


def _copy(src: IO[bytes], dst_path: str, cancel: threading.Event) -> None:
    with open(dst_path, "wb") as dst:
        while True:
            if cancel.is_set():
                raise _Cancelled()
            chunk = src.read(CHUNK)
            if not chunk:
                return
            dst.write(chunk)


def _check_member(name: str) -> None:
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise LocalizationError(f"archive member {name!r} has an absolute path")
    if ".." in PurePosixPath(name).parts:
        raise LocalizationError(f"archive member {name!r} has '..' in its path")


def _through_link(path: str, links: set[str]) -> Optional[str]:
    """The first step of `path` (relative, as written: "l/.." goes through "l") that is a symlink
    member, before its last component; None if it goes through none."""
    parts = PurePosixPath(path).parts
    for i in range(1, len(parts)):
        prefix = posixpath.normpath(posixpath.join(*parts[:i]))
        if prefix in links:
            return prefix
    return None


def _untar(archive: str, dest: str, keep: Optional[re.Pattern[str]], cancel: threading.Event) -> None:
    with tarfile.open(archive, "r:*") as tf:
        members = tf.getmembers()
        # Nothing is written, or pointed at, through a link the archive itself makes: checking each
        # path as text cannot follow such links, and the 'data' filter's own check was bypassed
        # by chains of them (CVE-2025-4517 and kin on Python before 3.11.13).
        links = {posixpath.normpath(m.name) for m in members if m.issym()}
        for m in members:
            _check_member(m.name)
            via = _through_link(m.name, links)
            if via is not None:
                raise LocalizationError(f"archive member {m.name!r} lies under {via!r}, a symlink in the archive")
            if m.issym():
                written = posixpath.join(posixpath.dirname(m.name), m.linkname)
                target = posixpath.normpath(written)
                if m.linkname.startswith("/") or target == ".." or target.startswith("../"):
                    raise LocalizationError(f"archive member {m.name!r} is a symlink to {m.linkname!r}, "
                                            "out of the unpacked dir")
                # (A link to a link is fine -- bin/python -> python3 -> python3.11 -- as each hop
                # resolves from a real dir of the archive; a link used as a dir on the way is not.)
                if _through_link(written, links) is not None:
                    raise LocalizationError(f"archive member {m.name!r} is a symlink to {m.linkname!r}, "
                                            "which goes through another symlink in the archive")
            elif m.islnk():
                _check_member(m.linkname)
                if _through_link(m.linkname, links) is not None:
                    raise LocalizationError(f"archive member {m.name!r} is a hard link to {m.linkname!r}, "
                                            "a path through a symlink in the archive")
            elif not (m.isfile() or m.isdir()):
                raise LocalizationError(f"archive member {m.name!r} is a device or fifo")

        def chosen() -> Iterator[tarfile.TarInfo]:
            for m in members:
                if cancel.is_set():
                    raise _Cancelled()
                if keep is None or keep.fullmatch(m.name):
                    yield m
        try:
            # The 'data' filter checks again against the real tree (a link through a link).
            tf.extractall(dest, members=chosen(), filter="data")
        except tarfile.FilterError as e:
            raise LocalizationError(f"archive member refused: {e}") from None


def _unzip(archive: str, dest: str, keep: Optional[re.Pattern[str]], cancel: threading.Event) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for i in infos:
            _check_member(i.filename)
        for i in infos:
            if cancel.is_set():
                raise _Cancelled()
            if keep is not None and not keep.fullmatch(i.filename):
                continue
            out = zf.extract(i, dest)
            mode = (i.external_attr >> 16) & 0o777
            if mode and not i.is_dir():     # keep an executable's x bits (zipfile drops them)
                os.chmod(out, mode | 0o600)


def unpack(archive: str, dest: str, pattern: str = "", cancel: Optional[threading.Event] = None) -> None:
    """Unpack a tar (any compression tarfile reads) or zip archive into `dest` (see the module doc)."""
    keep = re.compile(pattern) if pattern else None
    ev = cancel or threading.Event()
    os.makedirs(dest, exist_ok=True)
    if zipfile.is_zipfile(archive):
        _unzip(archive, dest, keep, ev)
    elif tarfile.is_tarfile(archive):
        _untar(archive, dest, keep, ev)
    else:
        raise LocalizationError("is not a tar or zip archive")


def fetch(res: LocalResource, target: str, cancel: Optional[threading.Event] = None) -> None:
    """Check the source and put the resource at `target` (a file, or a dir unpacked into)."""
    ev = cancel or threading.Event()
    src = _Source(res.resource)
    mode = src.check(res)
    if res.type == "FILE":
        with src.open() as f:
            _copy(f, target, ev)
        os.chmod(target, (mode & 0o755) | 0o644)
        return
    if src.path is not None:        # a local archive is unpacked where it is: no copy first
        unpack(src.path, target, res.pattern if res.type == "PATTERN" else "", ev)
        return
    download = target + ".download"
    with src.open() as f:
        _copy(f, download, ev)
    try:
        unpack(download, target, res.pattern if res.type == "PATTERN" else "", ev)
    finally:
        os.unlink(download)


def disk_usage(path: str) -> int:
    """Bytes of the files under `path` (symlinks not followed)."""
    if not os.path.isdir(path) or os.path.islink(path):
        return os.lstat(path).st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def link_into(work_dir: str, links: dict[str, str]) -> None:
    """Symlinks `name -> path` in the container's working dir (created if missing)."""
    os.makedirs(work_dir, exist_ok=True)
    for name, target in links.items():
        p = os.path.join(work_dir, name)
        if os.path.lexists(p):
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
        os.symlink(target, p)


# ----- the localizer --------------------------------------------------------------------------------

_SAFE_OWNER = re.compile(r"[A-Za-z0-9_.@-]+\Z")
_COMMIT_LOCKS = 64      # a fetch's commit takes the lock of its key's stripe


class _Fetch:
    """One fetch of a key, shared by every container waiting for it."""

    def __init__(self, done: "asyncio.Future[None]") -> None:
        self.done = done                    # settled when the fetch ends (its waiters wake)
        self.cancel = threading.Event()     # set when it is given up: its thread stops, commits nothing
        self.task: Optional[asyncio.Task[None]] = None


class Localizer:
    """The node's localizer (see the module doc): `localize` before a container starts, `release`
    when it is cleaned up, `app_finished` when the RM says its app is over."""

    def __init__(self, cfg: NMConfig) -> None:
        self.local_dir = os.path.abspath(cfg.local_dir)
        self.book = CacheBook(max(0, cfg.localizer_cache_mb) * MB)
        self.timeout_s = cfg.localizer_fetch_timeout_s
        self._pool = ThreadPoolExecutor(max(1, cfg.localizer_threads), thread_name_prefix="localizer")
        self._fetches: dict[CacheKey, _Fetch] = {}     # the key's fetch while its entry is FETCHING
        self._commit_locks = [threading.Lock() for _ in range(_COMMIT_LOCKS)]
        self._held: dict[str, list[CacheKey]] = {}
        self.fetches_started = 0        # fetches begun since start (a cache hit begins none)

    # ----- where -----

    def scope_dir(self, key: CacheKey) -> str:
        if key.scope == "PUBLIC":
            return os.path.join(self.local_dir, "filecache")
        if key.scope == "PRIVATE":
            return os.path.join(self.local_dir, "usercache", _owner_dir(key.owner), "filecache")
        return os.path.join(self.local_dir, _owner_dir(key.owner), "filecache")

    def entry_dir(self, key: CacheKey) -> str:
        return os.path.join(self.scope_dir(key), key.digest())

    def path(self, key: CacheKey) -> str:
        """Where the resource itself is (what the container's link points to)."""
        return os.path.join(self.entry_dir(key), basename_of(key.resource))

    # ----- localize -----

    async def localize(self, container_id: str, app_id: str, user: str,
                       resources: dict[str, LocalResource]) -> dict[str, str]:
        """Fetch (or find cached) every resource of a container: {link name: local path}. The
        container holds what it got until `release`, even when this raises LocalizationError or is
        cancelled (a cancelled wait drops only this container's reference: the fetch goes on for
        the others)."""
        names = list(resources)
        keys = [CacheKey.of(resources[n], user, app_id) for n in names]
        held = self._held.setdefault(container_id, [])
        outcomes = await asyncio.gather(*(self._get(k, held) for k in keys), return_exceptions=True)
        first: Optional[BaseException] = None
        links: dict[str, str] = {}
        for name, key, out in zip(names, keys, outcomes):
            if isinstance(out, BaseException):
                if first is None:
                    first = _named(name, key.resource, out)
            else:
                links[name] = self.path(key)
        if first is not None:
            raise first
        return links

    async def _get(self, key: CacheKey, held: list[CacheKey]) -> None:
        """One resource of a container: appended to `held` once it is on the node."""
        act = self.book.acquire(key)
        if act is Acquired.HIT:
            held.append(key)
            return
        if act is Acquired.FETCH:
            # The fetch is a task of its own: it goes on if the container that began it stops waiting.
            f = self._fetches[key] = _Fetch(asyncio.get_running_loop().create_future())
            f.task = asyncio.get_running_loop().create_task(self._run_fetch(key, f))
        f = self._fetches[key]
        try:
            await asyncio.shield(f.done)
        except asyncio.CancelledError:
            if not f.done.done():
                self._leave(key, f)
            elif not f.done.cancelled() and f.done.exception() is None:
                held.append(key)     # fetched just as it was cancelled: released with the rest
            raise
        held.append(key)

    def _leave(self, key: CacheKey, f: _Fetch) -> None:
        """A container stops waiting for the fetch `f` (it was stopped): its reference goes; the
        fetch is given up once no container waits for it."""
        self._delete(self.book.release(key))
        e = self.book.get(key)
        if e is not None and e.state is EntryState.FETCHING and e.refs == 0:
            self._give_up(key, f, LocalizationError("fetch cancelled: no container waits for it"))

    def _give_up(self, key: CacheKey, f: _Fetch, err: BaseException) -> None:
        """The fetch `f` failed or is abandoned: its waiters hear `err`, the entry goes from the
        book at once (a later request fetches afresh), and its thread -- which may run on -- is
        told to stop and to commit nothing."""
        f.cancel.set()
        if self._fetches.get(key) is f:
            del self._fetches[key]
            self.book.fetch_failed(key)
        if not f.done.done():
            f.done.set_exception(err)
            f.done.exception()     # waiters may be none: mark it retrieved

    async def _run_fetch(self, key: CacheKey, f: _Fetch) -> None:
        try:
            size = await self._fetch(key, f.cancel)
        except BaseException as e:
            self._give_up(key, f, e if isinstance(e, Exception) else LocalizationError("cancelled"))
            if not isinstance(e, Exception):
                raise
            return
        current = self._fetches.get(key) is f
        if current:
            del self._fetches[key]
        if not current or self.book.get(key) is None:
            # Given up after its thread had committed, or its app finished while it was fetched:
            # nobody uses this copy (if the book has the key again, a newer fetch replaces it).
            if self.book.get(key) is None:
                self._delete([key])
            if not f.done.done():
                f.done.set_exception(LocalizationError("its application finished while it was fetched"))
                f.done.exception()
            return
        self._delete(self.book.fetched(key, size))
        f.done.set_result(None)

    async def _fetch(self, key: CacheKey, cancel: threading.Event) -> int:
        self.fetches_started += 1
        res = LocalResource(resource=key.resource, type=key.type, pattern=key.pattern,
                            size=key.size, timestamp=key.timestamp)
        fut = asyncio.get_running_loop().run_in_executor(self._pool, self._fetch_entry, key, res, cancel)
        fut.add_done_callback(lambda ended: self._thread_ended(key, ended, cancel))
        try:
            async with asyncio.timeout(self.timeout_s):
                return await asyncio.shield(fut)
        except asyncio.TimeoutError:
            cancel.set()
            raise LocalizationError(f"fetch timed out after {self.timeout_s:g} s") from None
        except BaseException:
            cancel.set()
            raise

    def _thread_ended(self, key: CacheKey, fut: "asyncio.Future[int]", cancel: threading.Event) -> None:
        """A fetch's thread returned (on the loop; a fetch given up no longer awaits it)."""
        if fut.cancelled() or fut.exception() is not None:
            return
        if cancel.is_set() and self.book.get(key) is None:
            # It committed just before it was given up: nobody uses that copy. (With the key in
            # the book again, a newer fetch's commit replaces it.)
            self._delete([key])

    def _commit_lock(self, key: CacheKey) -> threading.Lock:
        return self._commit_locks[hash(key) % len(self._commit_locks)]

    def _fetch_entry(self, key: CacheKey, res: LocalResource, cancel: threading.Event) -> int:
        """In a localizer thread: fetch into a temp dir, then rename it into place and write the
        entry's completion record; returns its size in bytes. Once given up (`cancel`), it never
        touches the entry's dir: a newer fetch of the key may have made it, for a running container."""
        scope = self.scope_dir(key)
        os.makedirs(scope, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".tmp-{key.digest()}-", dir=scope)
        try:
            fetch(res, os.path.join(tmp, basename_of(key.resource)), cancel)
            size = disk_usage(tmp)
            final = self.entry_dir(key)
            with self._commit_lock(key):
                # Under the key's lock: a cancel set before this check is seen; one set after it
                # comes before any newer fetch of the key, whose commit waits for this lock.
                if cancel.is_set():
                    raise _Cancelled()
                if os.path.lexists(final):  # left by an NM that stopped before the record, or a fetch given up late
                    shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
                _write_json(final + ".json", {"key": asdict(key), "size_bytes": size})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return size

    # ----- release -----

    def release(self, container_id: str) -> None:
        """The container is done with its resources; entries over the bound go."""
        gone: list[CacheKey] = []
        for key in self._held.pop(container_id, []):
            gone += self.book.release(key)
        self._delete(gone)

    def app_finished(self, app_id: str) -> None:
        """The app is over on this node: its APPLICATION entries (and their dir) go."""
        self._delete(self.book.drop_app(app_id))
        app_cache = os.path.join(self.local_dir, _owner_dir(app_id), "filecache")
        self._trash(app_cache)

    def _delete(self, keys: list[CacheKey]) -> None:
        for key in keys:
            self._remove_entry_files(key, background=True)

    def _remove_entry_files(self, key: CacheKey, background: bool = False) -> None:
        # The completion record first, then the dir renamed out of the way at once (a metadata op),
        # so a new fetch of the same key never meets a half-deleted entry; the tree goes in a thread.
        try:
            os.unlink(self.entry_dir(key) + ".json")
        except FileNotFoundError:
            pass
        if background:
            self._trash(self.entry_dir(key))
        else:
            shutil.rmtree(self.entry_dir(key), ignore_errors=True)

    def _trash(self, d: str) -> None:
        if not os.path.lexists(d):
            return
        gone = f"{d}.deleting-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(d, gone)
        except OSError:
            gone = d
        try:
            self._pool.submit(shutil.rmtree, gone, True)
        except RuntimeError:        # the pool is shut down (the NM is stopping): do it here
            shutil.rmtree(gone, ignore_errors=True)

    # ----- restart -----

    def restore(self) -> int:
        """Take back the complete entries a previous NM run left (blocking; at start-up); remove
        fetches cut short. Returns how many entries were restored."""
        scopes = [os.path.join(self.local_dir, "filecache")]
        scopes += _glob_dirs(os.path.join(self.local_dir, "usercache"), "filecache")
        scopes += _glob_dirs(self.local_dir, "filecache")
        n = 0
        for scope in scopes:
            try:
                names = os.listdir(scope)
            except OSError:
                continue
            for name in names:
                p = os.path.join(scope, name)
                if name.endswith(".json"):
                    continue
                record = _read_json(p + ".json")
                try:
                    key = CacheKey(**record["key"]) if record else None
                except TypeError:
                    key = None
                if key is None or name != key.digest() or self.entry_dir(key) != p:
                    shutil.rmtree(p, ignore_errors=True)
                    continue
                self.book.restore(key, int(record.get("size_bytes", 0)) if record else 0)
                n += 1
        return n

    def pin_links(self, container_id: str, work_dir: str) -> int:
        """A container that survived an NM restart holds the entries its working dir links to."""
        by_path = {self.path(k): k for k in self.book.entries}
        held = self._held.setdefault(container_id, [])
        try:
            names = os.listdir(work_dir)
        except OSError:
            return 0
        for name in names:
            p = os.path.join(work_dir, name)
            if os.path.islink(p):
                key = by_path.get(os.readlink(p))
                if key is not None and self.book.pin(key):
                    held.append(key)
        return len(held)

    def close(self) -> None:
        """Give up every fetch (their threads stop at their next cancel check) and the pool."""
        for f in list(self._fetches.values()):
            f.cancel.set()
            if f.task is not None:
                f.task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _named(name: str, url: str, e: BaseException) -> LocalizationError:
    """The container's diagnostic: which resource, where from, and why."""
    if isinstance(e, _Cancelled):
        cause = "fetch cancelled"
    elif isinstance(e, LocalizationError):
        cause = str(e)
    elif isinstance(e, FileNotFoundError):
        cause = "no such file"
    elif isinstance(e, PermissionError):
        cause = "permission denied"
    else:
        cause = f"{type(e).__name__}: {e}"
    return LocalizationError(f"local resource {name!r} ({url}): {cause}")


def _owner_dir(owner: str) -> str:
    """A user or app id as one path component (anything odd is hex-encoded, never a '/' or '..')."""
    if _SAFE_OWNER.match(owner) and owner not in (".", ".."):
        return owner
    return "_" + owner.encode().hex()


def _glob_dirs(parent: str, child: str) -> list[str]:
    try:
        return [os.path.join(parent, d, child) for d in os.listdir(parent)
                if os.path.isdir(os.path.join(parent, d, child))]
    except OSError:
        return []


def _write_json(path: str, obj: dict[str, Any]) -> None:
    # durable: the cache's records outlive an NM restart
    write_atomic(path, json.dumps(obj).encode())


def _read_json(path: str) -> Optional[dict[str, Any]]:
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


__all__ = ["LocalizationError", "Localizer", "basename_of", "disk_usage", "fetch", "link_into", "unpack",
           "validate"]
