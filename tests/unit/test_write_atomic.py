"""durable_storage.write_atomic, the one atomic-write helper: whole old or whole new file, fsync
only when durable, the file's mode set before its first byte, no temporary file left behind."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from protocol import config
from protocol.durable_storage import write_atomic


def test_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    write_atomic(p, b"old")
    write_atomic(p, [b"ne", memoryview(b"w!")])
    assert p.read_bytes() == b"new!"
    assert os.listdir(tmp_path) == ["f.json"]


def test_fsyncs_only_when_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "ready", b"{}", durable=False)
    assert synced == []
    write_atomic(tmp_path / "ckpt", b"{}")
    assert len(synced) == 2          # the file, then its directory


def test_mode_is_the_files_from_the_start(tmp_path: Path) -> None:
    p = tmp_path / "secret.toml"
    write_atomic(p, b"secret = 'x'", mode=0o600)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    p = tmp_path / "f"
    write_atomic(p, b"old")

    def chunks():
        yield b"half"
        raise RuntimeError("writer died")
    with pytest.raises(RuntimeError):
        write_atomic(p, chunks())
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_cluster_secret_file_is_written_0600(tmp_path: Path) -> None:
    conf = tmp_path / "cluster.toml"
    secret = config.ensure_secret(conf)
    assert secret in conf.read_text() and stat.S_IMODE(conf.stat().st_mode) == 0o600


@pytest.mark.parametrize("text", [
    '[cluster] # shared by every host\nrm_address = "http://rm1:8088"\n',   # a comment after the header
    '[ cluster ]\nsecret=""\n',                                              # spaced header, no spaces
    "[cluster]\nsecret = ''\n",                                              # the other quotes
    '[storage]\ns3_endpoint_url = "http://s3:8333"\n',                       # no [cluster] table at all
])
def test_the_generated_secret_is_the_one_the_file_then_holds(tmp_path: Path, text: str) -> None:
    """`elastane secret` said "generated" and saved nothing (or a duplicate key) for these: each RM
    start then made its own, and NMs were refused. Whatever the file's layout, it now holds it."""
    conf = tmp_path / "cluster.toml"
    conf.write_text(text)
    secret = config.ensure_secret(conf)
    assert config.load_cluster(str(conf)).secret == secret and len(secret) >= 32
    assert config.ensure_secret(conf) == secret          # kept, not generated again
