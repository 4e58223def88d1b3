"""The S3 test server itself (tests/support/s3_server.py): it serves signed requests on loopback,
refuses wrong keys and missing buckets as AWS does, and stops leaving no process behind."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import s3_server as s3mod

pytestmark = pytest.mark.skipif(s3mod.unavailable_reason() is not None,
                                reason=f"no S3 server here: {s3mod.unavailable_reason()}")


def test_a_bucket_keeps_what_is_put_and_the_environment_reaches_it(s3) -> None:
    import fsspec

    fs, path = fsspec.core.url_to_fs(s3.url("a", "b.txt"))   # configured only by the environment
    fs.pipe_file(path, b"hello")
    assert s3.filesystem().cat_file(f"{s3.bucket}/a/b.txt") == b"hello"
    assert s3.endpoint_url.startswith("http://127.0.0.1:") and os.environ["AWS_ENDPOINT_URL_S3"] == s3.endpoint_url


def test_wrong_keys_and_missing_buckets_are_refused(s3) -> None:
    s3.filesystem().pipe_file(f"{s3.bucket}/x", b"1")
    with pytest.raises(PermissionError):
        s3.filesystem(secret="not-the-secret").cat_file(f"{s3.bucket}/x")
    with pytest.raises(FileNotFoundError):     # no bucket appears on a first upload
        s3.filesystem().pipe_file("no-such-bucket/x", b"1")


def test_a_server_stops_by_its_pid_and_leaves_no_process(tmp_path: Path) -> None:
    server = s3mod.start_s3_server(tmp_path / "s3")
    try:
        bucket = server.create_bucket()
        assert bucket in server.filesystem().ls("")
    finally:
        server.stop()
    assert server.process.returncode is not None
    assert not Path(f"/proc/{server.pid}").exists()
