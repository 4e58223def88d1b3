"""Shipping a job's files like spark-submit: `--py-files`, `--files`, `--archives`.

Each file is uploaded to the cluster's staging area, `<staging_dir>/<user>/<application-id>/`
(cluster.toml's `staging_dir`: a path every host reads, a `file://` URL of a shared mount, or any
fsspec URL such as s3://bucket/staging), and named as a YARN LocalResource (protocol.local_resources)
with the size and mtime of the uploaded copy; the NM links it into each container's working dir
under its file name. Without a staging_dir a local file is referenced in place by its absolute path:
that works on one host, or where the path is on a mount every host shares.

`--py-files` are Python modules (.py): linked into the working dir, which the app loader puts on
sys.path, so a job's `module:Class` app imports from them. `--archives` (.tar, .tar.gz, .tgz,
.zip) are unpacked by the NM into a directory named after the archive.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from protocol import durable_storage
from protocol.local_resources import LocalResource, LocalResourceError, check_link_name

from .errors import OperationFailed, UsageError

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")


def split_list(values: Sequence[str] | None) -> list[str]:
    """Repeatable flags that also take comma lists: ["a.py,b.py", "c.py"] -> [a.py, b.py, c.py]."""
    return [v.strip() for text in values or () for v in text.split(",") if v.strip()]


@dataclass
class ShippedFiles:
    """The local files a submission ships, by link name: what each flag named, checked."""

    files: dict[str, tuple[Path, str]] = field(default_factory=dict)   # link -> (path, LocalResource type)

    @classmethod
    def from_flags(cls, py_files: Sequence[str] | None, files: Sequence[str] | None,
                   archives: Sequence[str] | None) -> "ShippedFiles":
        """Check every named file exists and is of its flag's kind; UsageError naming the flag."""
        out = cls()
        for flag, names, kind in (("--py-files", py_files, "FILE"), ("--files", files, "FILE"),
                                  ("--archives", archives, "ARCHIVE")):
            for name in split_list(names):
                path = Path(name).expanduser()
                if not path.is_file():
                    raise UsageError(f"{flag}: {name}: no such file")
                if flag == "--py-files" and path.suffix != ".py":
                    raise UsageError(f"{flag}: {name}: not a Python module (.py)")
                if flag == "--archives" and not path.name.endswith(ARCHIVE_SUFFIXES):
                    raise UsageError(f"{flag}: {name}: not an archive ({', '.join(ARCHIVE_SUFFIXES)})")
                try:
                    check_link_name(path.name)
                except LocalResourceError as e:
                    raise UsageError(f"{flag}: {e}") from None
                if path.name in out.files:
                    raise UsageError(f"{flag}: {name}: a second file named {path.name!r} "
                                     "(each is linked into the working dir under its own name)")
                out.files[path.name] = (path.resolve(), kind)
        return out

    def __bool__(self) -> bool:
        return bool(self.files)

    def module_dirs(self) -> list[str]:
        """The directories of the shipped .py modules (the client imports them from there)."""
        return sorted({str(p.parent) for p, _ in self.files.values() if p.suffix == ".py"})

    def stage(self, staging_dir: Optional[str], user: str, app_id: str) -> dict[str, LocalResource]:
        """Upload to `<staging_dir>/<user>/<app_id>/` (or, without a staging_dir, reference each
        file in place); the LocalResources naming the copies."""
        if not self.files:
            return {}
        if not staging_dir:
            return {name: _resource(str(path), kind, path.stat().st_size, path.stat().st_mtime)
                    for name, (path, kind) in self.files.items()}
        try:    # an object store's bucket must be there and these credentials good: exit 2 if not
            durable_storage.check_reachable(staging_dir)
        except durable_storage.DurableStorageError as e:
            raise UsageError(f"staging_dir: {e}") from None
        target = durable_storage.join(staging_dir, user, app_id)
        try:
            return _upload(target, self.files)
        except Exception as e:  # noqa: BLE001 - OSError, or an object store client's own errors
            raise OperationFailed(f"could not upload the job's files to {target}: "
                                  f"{durable_storage.describe_error(e)}") from None


def _resource(url: str, kind: str, size: int, mtime_s: float) -> LocalResource:
    return LocalResource(resource=url, type=kind, visibility="APPLICATION",  # type: ignore[arg-type]
                         size=int(size), timestamp=int(mtime_s * 1000) if mtime_s >= 0 else -1)


def _upload(target: str, files: dict[str, tuple[Path, str]]) -> dict[str, LocalResource]:
    local = durable_storage.local_path(target)
    out: dict[str, LocalResource] = {}
    if local is not None:
        d = durable_storage.DurableDir(target)
        d.makedirs()
        d.put_files([p for p, _ in files.values()])
        for name, (_, kind) in files.items():
            st = os.stat(os.path.join(local, name))
            out[name] = _resource(os.path.join(local, name), kind, st.st_size, st.st_mtime)
        return out
    import fsspec  # type: ignore[import-untyped]  # noqa: PLC0415  # only a remote staging area needs it

    fs, root = fsspec.core.url_to_fs(target)
    fs.makedirs(root, exist_ok=True)
    for name, (path, kind) in files.items():
        remote = f"{root.rstrip('/')}/{name}"
        fs.put_file(str(path), remote)
        info: dict[str, Any] = fs.info(remote)
        out[name] = _resource(durable_storage.join(target, name), kind, int(info.get("size", -1)), _mtime(info))
    return out


def _mtime(info: dict[str, Any]) -> float:
    """The uploaded object's mtime in seconds, as the filesystem reports it (-1: not known)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        v = info.get(key)
        if isinstance(v, (int, float)):
            return float(v)
        stamp = getattr(v, "timestamp", None)     # a datetime
        if callable(stamp):
            return float(stamp())
    return -1.0


@contextlib.contextmanager
def importable(dirs: Sequence[str]) -> Iterator[None]:
    """`dirs` first on sys.path for the block, and the modules imported meanwhile forgotten after
    it (the client imports a user's module only to validate the job with its own types)."""
    before_path, before_modules = list(sys.path), set(sys.modules)
    sys.path[:0] = [d for d in dirs if d not in sys.path]
    try:
        yield
    finally:
        sys.path[:] = before_path
        for name in set(sys.modules) - before_modules:
            sys.modules.pop(name, None)
