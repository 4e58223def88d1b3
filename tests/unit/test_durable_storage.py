"""protocol.durable_storage: locations (path, file://, fsspec URLs), their validation and the
RM's `checkpoint_dir`, and DurableDir against a local dir and against fsspec's in-memory filesystem
(which proves a non-local URL goes through fsspec: another fsspec client sees what it wrote)."""
from __future__ import annotations

import importlib.util
import os
import uuid
from pathlib import Path

import fsspec
import msgspec
import pytest

from protocol import config, container_env, durable_storage
from protocol.durable_storage import DurableDir, DurableStorageError
from test_rm_api import close_env, make_env


def test_local_locations_are_paths_and_other_urls_are_not() -> None:
    assert durable_storage.local_path("/shared/apps") == "/shared/apps"
    assert durable_storage.local_path("file:///shared/apps") == "/shared/apps"
    assert durable_storage.local_path("s3://bucket/apps") is None
    assert durable_storage.local_path("memory://apps") is None
    assert durable_storage.join("/shared/apps", "app_1") == "/shared/apps/app_1"
    assert durable_storage.join("s3://bucket/apps/", "app_1", "checkpoints") == "s3://bucket/apps/app_1/checkpoints"
    assert durable_storage.join("file:///shared/apps", "app_1") == "file:///shared/apps/app_1"


def test_validate_names_what_is_wrong() -> None:
    for ok in ("/shared/elastane/apps", "file:///shared/elastane/apps", "memory://elastane/apps"):
        durable_storage.validate(ok)
    with pytest.raises(DurableStorageError, match="no fsspec filesystem implements the scheme nosuch://"):
        durable_storage.validate("nosuch://bucket/apps")
    with pytest.raises(DurableStorageError, match="not an absolute path"):
        durable_storage.validate("shared/apps")
    with pytest.raises(DurableStorageError, match="not an absolute path"):
        durable_storage.validate("file://shared/apps")
    with pytest.raises(DurableStorageError, match="empty location"):
        durable_storage.validate("")
    for bad in ("/tmp/a\0b", "s3://bucket/a\0b"):      # a job's `output` or `init_from` among them
        with pytest.raises(DurableStorageError, match="contains a NUL character"):
            durable_storage.validate(bad)


@pytest.mark.skipif(importlib.util.find_spec("s3fs") is not None, reason="s3fs is installed here")
def test_a_known_scheme_whose_package_is_missing_is_refused() -> None:
    with pytest.raises(DurableStorageError, match=r"the filesystem for s3:// is not installed.*s3fs"):
        durable_storage.validate("s3://bucket/elastane")


def test_rm_config_checks_checkpoint_dir(tmp_path) -> None:
    assert config.RMConfig().checkpoint_dir == ""
    assert config.RMConfig(checkpoint_dir="memory://elastane/apps").checkpoint_dir == "memory://elastane/apps"
    with pytest.raises(ValueError, match="checkpoint_dir: .*nosuch://"):
        config.RMConfig(checkpoint_dir="nosuch://bucket")
    with pytest.raises(ValueError, match="checkpoint_dir: .*absolute"):
        msgspec.structs.replace(config.RMConfig(), checkpoint_dir="relative/dir")    # as a CLI override
    toml = tmp_path / "rm.toml"
    toml.write_text('[rm]\ncheckpoint_dir = "gopher://elastane"\n')
    with pytest.raises(config.ConfigError, match=r"rm.toml: \[rm\] checkpoint_dir: .*gopher://"):
        config.load_rm(str(toml))


def test_the_shipped_rm_toml_loads_with_its_default() -> None:
    assert config.load_rm(str(Path(__file__).resolve().parents[2] / "conf" / "rm.toml")).checkpoint_dir == ""


# ===== DurableDir on a local dir and on memory:// =================================================

@pytest.fixture(params=["local", "file", "memory"])
def durable(request, tmp_path) -> DurableDir:
    if request.param == "local":
        return DurableDir(tmp_path / "d")
    if request.param == "file":
        return DurableDir(f"file://{tmp_path}/d")
    return DurableDir(f"memory://test-{uuid.uuid4().hex}/d")


def test_a_durable_dir_writes_reads_and_lists(durable, tmp_path) -> None:
    assert durable.entries() == ([], [])           # not there yet
    durable.makedirs()
    durable.write_bytes("a.json", b"one")
    durable.write_bytes("a.json", b"two")           # replaced whole
    sub = durable.child("epoch-1")
    sub.makedirs()
    sub.write_bytes("job.json", b"{}")
    assert durable.read_bytes("a.json") == b"two"
    assert durable.entries() == (["epoch-1"], ["a.json"])
    assert sub.entries() == ([], ["job.json"])
    with pytest.raises(FileNotFoundError):
        durable.read_bytes("missing.json")
    src = tmp_path / "src"
    src.mkdir()
    for name, data in (("block_0.npz", b"x" * 1000), ("manifest-e0.json", b"{}")):
        (src / name).write_bytes(data)
    sub.put_files(sorted(src.iterdir()))
    dst = tmp_path / "dst"
    dst.mkdir()
    sub.get_files(sub.entries()[1], dst)
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == {
        "block_0.npz": b"x" * 1000, "manifest-e0.json": b"{}", "job.json": b"{}"}
    for bad in ("", "..", "a/b"):
        with pytest.raises(DurableStorageError, match="not a single path component"):
            durable.child(bad)


def test_a_memory_url_goes_through_fsspec(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = f"memory://test-{uuid.uuid4().hex}/apps"
    d = DurableDir(root).child("app_1")
    assert d.local is None and d.url == f"{root}/app_1"
    d.makedirs()
    d.write_bytes("status.json", b'{"ok": true}')
    assert fsspec.filesystem("memory").cat_file(f"{root}/app_1/status.json") == b'{"ok": true}'
    assert list(tmp_path.iterdir()) == []           # nothing landed on the local disk
    with pytest.raises(DurableStorageError, match="nosuch"):
        DurableDir("nosuch://x")


def test_local_writes_are_atomic(tmp_path, monkeypatch) -> None:
    d = DurableDir(tmp_path)
    d.write_bytes("job.json", b"old")

    def crash(src, dst):
        raise OSError("crash before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="crash"):
        d.write_bytes("job.json", b"new")
    monkeypatch.undo()
    assert d.read_bytes("job.json") == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]     # no temporary file left behind


# ===== the RM hands each AM <checkpoint_dir>/<app_id> ============================================

async def _am_dir(tmp_path, **cfg) -> tuple[str, str]:
    env = await make_env(tmp_path, **cfg)
    try:
        await env.register_node("n1:1")
        app_id = await env.submit()
        await env.rm.launcher.drain()
        _, req = env.nm.started[-1]
        return app_id, req.launch_context.environment[container_env.AM_DIR]
    finally:
        await close_env(env)


async def test_the_rm_passes_each_am_its_dir_under_checkpoint_dir(tmp_path) -> None:
    app_id, am_dir = await _am_dir(tmp_path / "a", checkpoint_dir="memory://elastane/apps")
    assert am_dir == f"memory://elastane/apps/{app_id}"
    assert not (tmp_path / "a" / "state" / "apps").exists()       # the RM creates no local dir for it
    app_id, am_dir = await _am_dir(tmp_path / "b", checkpoint_dir=f"file://{tmp_path}/shared")
    assert am_dir == f"{tmp_path}/shared/{app_id}"                 # a local one goes as a plain path
    app_id, am_dir = await _am_dir(tmp_path / "c")                 # unset: <state_dir>/apps, created
    assert am_dir == str(tmp_path / "c" / "state" / "apps" / app_id) and Path(am_dir).is_dir()
