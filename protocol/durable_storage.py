"""Durable storage for what outlives an AM attempt -- a PS job's checkpoints and the AM's final
status -- so that a new attempt on another host finds what the last one wrote.

A location is a plain path, a `file://` URL, or a URL of any filesystem fsspec implements
(`s3://bucket/prefix`, `gs://...`, `memory://...`). Local locations (a path, `file://`: on a
cluster, a shared mount such as NFS) use plain os calls: writes are atomic and durable (temporary
file, fsync, rename, fsync of the directory). Every other URL goes through fsspec, where one put of
an object is the atomic step (object stores publish an object whole or not at all); on fsspec
filesystems without atomic puts a reader sees a partial file at worst, which the callers' formats
detect (a checkpoint's job.json that does not parse is an incomplete checkpoint).

The RM validates rm.toml's `checkpoint_dir` with `validate` and joins per-app locations with
`join`; the AM reads and writes through `DurableDir`.
"""
from __future__ import annotations

import errno
import os
import posixpath
import shutil
import secrets
from pathlib import Path
from typing import Any, Iterable, Sequence, Union
from protocol.errors import ConfigurationError

# what write_atomic writes: a bytes-like object, or several written one after another
Chunk = Union[bytes, bytearray, memoryview]

FILE_SCHEME = "file://"


class DurableStorageError(ConfigurationError, ValueError):
    """A durable-storage location that is malformed or names a scheme with no usable filesystem."""


def _scheme(url: str) -> str | None:
    """The URL's scheme ("s3" for s3://...), None for a plain path."""
    head, sep, _ = url.partition("://")
    return head if sep and head and "/" not in head else None


def local_path(url: str) -> str | None:
    """The local directory a plain path or `file://` URL names; None for any other scheme."""
    scheme = _scheme(url)
    if scheme is None:
        return url
    if scheme in ("file", "local"):
        return url.split("://", 1)[1]
    return None


def validate(url: str) -> None:
    """Raise DurableStorageError unless `url` is an absolute path, a `file://` URL of one, or a URL
    whose scheme fsspec implements in this installation (its package imports)."""
    if not url:
        raise DurableStorageError("empty location: give an absolute path or a URL such as s3://bucket/prefix")
    if "\0" in url:
        raise DurableStorageError(f"{url!r} contains a NUL character, which no path or URL may hold")
    path = local_path(url)
    if path is not None:
        if not os.path.isabs(path):
            raise DurableStorageError(f"{url!r} is not an absolute path (an AM runs in its own working "
                                      f"directory on another host): use /abs/path or file:///abs/path")
        return
    scheme = _scheme(url)
    try:
        fsspec = _fsspec()
        fsspec.get_filesystem_class(scheme)
    except ImportError as e:
        raise DurableStorageError(f"{url!r}: the filesystem for {scheme}:// is not installed ({e})") from None
    except ValueError:
        raise DurableStorageError(f"{url!r}: no fsspec filesystem implements the scheme {scheme}://") from None


# Schemes whose first path component is a bucket (container) that must exist before anything is
# written under it, and whose access a client's credentials decide: what `check_reachable` probes.
BUCKET_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def bucket_of(url: str) -> str | None:
    """"s3://bucket" for a URL of a `BUCKET_SCHEMES` store, else None."""
    scheme = _scheme(url)
    if scheme not in BUCKET_SCHEMES:
        return None
    return f"{scheme}://" + url.split("://", 1)[1].strip("/").split("/", 1)[0]


def check_reachable(url: str) -> None:
    """For an object-store URL (`BUCKET_SCHEMES`): its bucket exists and this process's
    credentials may use it, else DurableStorageError naming the URL and what is wrong (a missing
    bucket, access denied, an endpoint that does not answer). Nothing is checked for other
    locations: a path may be a mount only the nodes have, and a prefix in a bucket need not exist
    yet (writers create it). One request (the bucket's head) per call."""
    validate(url)
    scheme = _scheme(url)
    if scheme not in BUCKET_SCHEMES:
        return
    try:
        fs, path = _fsspec().core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise DurableStorageError(f"{url!r}: {e}") from None
    bucket = str(path).strip("/").split("/", 1)[0]
    if not bucket:
        raise DurableStorageError(f"{url!r} names no bucket: use {scheme}://BUCKET/prefix")
    try:
        fs.info(bucket)
    except FileNotFoundError:
        raise DurableStorageError(f"{url!r}: the bucket {bucket!r} does not exist") from None
    except PermissionError as e:
        raise DurableStorageError(f"{url!r}: access to the bucket {bucket!r} is denied ({e}): check the "
                                  f"credentials ([storage] in cluster.toml or AWS_ACCESS_KEY_ID / "
                                  f"AWS_SECRET_ACCESS_KEY)") from None
    except Exception as e:  # noqa: BLE001 - botocore's connection errors are not OSErrors
        raise DurableStorageError(f"{url!r}: cannot reach the object store: {e}") from None


def describe_error(e: BaseException) -> str:
    """Why reading or writing a location failed, for a message that names the location: an OS
    error's own words, and for an object store a missing object or denied access said so (its
    client's message is often just "Forbidden")."""
    if isinstance(e, OSError) and e.strerror:
        return str(e.strerror)
    if isinstance(e, PermissionError):
        return f"access denied ({e}): check the object store credentials"
    if isinstance(e, FileNotFoundError):
        return "no such file or object"
    return str(e) or type(e).__name__


def read_url(url: str) -> bytes:
    """The whole contents of the file a path, `file://` URL or fsspec URL names (OSError if it
    cannot be read; for object stores also whatever their client raises)."""
    path = local_path(url)
    if path is not None:
        with open(path, "rb") as f:
            return f.read()
    try:
        fs, remote = _fsspec().core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise DurableStorageError(f"{url!r}: {e}") from None
    return bytes(fs.cat_file(remote))


def join(url: str, *names: str) -> str:
    """`url` with `names` appended as path components (a URL keeps its scheme and slashes)."""
    path = local_path(url)
    if path is not None and _scheme(url) is None:
        return os.path.join(url, *names)
    return "/".join([url.rstrip("/"), *names])


# ===== local files ===============================================================================

def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file written earlier to stable storage (an fd opened read-only syncs the inode)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames and creations in a directory durable. Filesystems that cannot sync a
    directory (EINVAL) are left to their own guarantees."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: Chunk | Iterable[Chunk], *, durable: bool = True,
                 mode: int = 0o666) -> None:
    """Write `data` (bytes, or buffers written one after another) to `path` so that a reader (or a
    crash) sees the old file or the new one whole: a temporary file in the same directory, renamed
    over `path`. `durable`: the file and then its directory are fsynced, so the new contents also
    survive a power loss; False for files that only need atomicity (ready files, spills that die
    with their process), which then skip the fsyncs' cost. `mode`: the new file's permissions
    (less the umask), e.g. 0o600 for a file holding a secret -- set before any byte is written.

    The one atomic-write helper of the code base: every writer that claims atomicity or
    durability goes through it."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, (bytes, bytearray, memoryview)):
                f.write(data)
            else:
                for buf in data:
                    f.write(buf)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(target.parent)


# ===== a durable directory =======================================================================

class DurableDir:
    """One directory of durable storage: a local one through os calls, any other URL through fsspec.

    `local` is the local path when there is one (callers may then use their own file code on it,
    as the checkpoints' format does); names given to the methods are single path components.
    """

    def __init__(self, url: str | os.PathLike[str], *, fs: Any = None, fs_path: str | None = None) -> None:
        """`fs` and `fs_path`: the fsspec filesystem and its path for `url`, when known already."""
        self.url = os.fspath(url)
        path = local_path(self.url)
        self.local: Path | None = Path(path) if path is not None else None
        self._fs = fs
        self._path = fs_path
        if self.local is None and (self._fs is None or self._path is None):
            try:
                self._fs, self._path = _fsspec().core.url_to_fs(self.url)
            except (ImportError, ValueError) as e:
                raise DurableStorageError(f"{self.url!r}: {e}") from None

    def __repr__(self) -> str:
        return f"DurableDir({self.url!r})"

    def child(self, name: str) -> DurableDir:
        _check_name(name)
        if self.local is not None:
            return DurableDir(self.local / name)
        return DurableDir(join(self.url, name), fs=self._fs, fs_path=posixpath.join(self._remote(), name))

    def makedirs(self) -> None:
        if self.local is not None:
            self.local.mkdir(parents=True, exist_ok=True)
        else:
            self._fs.makedirs(self._remote(), exist_ok=True)

    def write_bytes(self, name: str, data: bytes) -> None:
        """Replace `name` with `data` atomically (see the module doc); the directory must exist
        where the filesystem has directories."""
        _check_name(name)
        if self.local is not None:
            write_atomic(self.local / name, data)
        else:
            self._fs.pipe_file(self._at(name), data)

    def read_bytes(self, name: str) -> bytes:
        """The contents of `name`; FileNotFoundError (an OSError) if there is none."""
        _check_name(name)
        if self.local is not None:
            return (self.local / name).read_bytes()
        return bytes(self._fs.cat_file(self._at(name)))

    def entries(self) -> tuple[list[str], list[str]]:
        """(subdirectory names, file names) in this directory, each sorted; ([], []) if it does not
        exist."""
        dirs: list[str] = []
        files: list[str] = []
        if self.local is not None:
            if not self.local.is_dir():
                return [], []
            for p in self.local.iterdir():
                (dirs if p.is_dir() else files).append(p.name)
        else:
            try:
                listing = self._fs.ls(self._remote(), detail=True)
            except FileNotFoundError:
                return [], []
            for e in listing:
                name = posixpath.basename(str(e["name"]).rstrip("/"))
                if name:
                    (dirs if e.get("type") == "directory" else files).append(name)
        return sorted(dirs), sorted(files)

    def remove_file(self, name: str) -> None:
        """Remove the file `name` (nothing if it is not there)."""
        _check_name(name)
        try:
            if self.local is not None:
                (self.local / name).unlink()
            else:
                self._fs.rm_file(self._at(name))
        except FileNotFoundError:
            pass

    def remove_child(self, name: str) -> None:
        """Remove the subdirectory `name` and everything under it (nothing if it is not there)."""
        _check_name(name)
        if self.local is not None:
            shutil.rmtree(self.local / name, ignore_errors=True)
            return
        try:
            self._fs.rm(self._at(name), recursive=True)
        except FileNotFoundError:
            pass

    def put_files(self, sources: Sequence[Path]) -> None:
        """Copy local files into this directory under their own names (a batch: fsspec may send
        them concurrently); each one is a single atomic put where the store has those."""
        if not sources:
            return
        for p in sources:
            _check_name(p.name)
        if self.local is not None:
            for p in sources:
                write_atomic(self.local / p.name, p.read_bytes())
            return
        self._fs.put([str(p) for p in sources], [self._at(p.name) for p in sources])

    def get_files(self, names: Sequence[str], target: Path) -> None:
        """Copy `names` from this directory into the local directory `target`."""
        if not names:
            return
        for n in names:
            _check_name(n)
        if self.local is not None:
            for n in names:
                (target / n).write_bytes((self.local / n).read_bytes())
            return
        self._fs.get([self._at(n) for n in names], [str(target / n) for n in names])

    def _remote(self) -> str:
        assert self._path is not None
        return self._path

    def _at(self, name: str) -> str:
        return posixpath.join(self._remote(), name)


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise DurableStorageError(f"{name!r} is not a single path component")


def _fsspec() -> Any:
    """fsspec, imported on first use: a daemon with a local location never loads it."""
    import fsspec  # type: ignore[import-untyped]  # noqa: PLC0415  # no type information shipped
    return fsspec
