"""psruntime.store.buffer_file: the one header + aligned raw buffers file format (checkpoint blocks,
spills, inactive EPS splits, worker state) round-trips with and without lz4 and refuses damage."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from psruntime.store import buffer_file
from psruntime.store.buffer_file import ALIGN, BufferFileError

ARRAYS = [np.arange(7, dtype=np.int64), np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4),
          np.zeros((2, 0), np.float64), np.array([1, 0, 1], np.bool_), np.array(2.5, np.float64),
          np.arange(9, dtype=np.int16)[::2]]        # not contiguous: stored contiguous


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(tmp_path: Path, compress: bool) -> None:
    content = {"blocks": [{"block": 3, "other_keys": ["k"], "has_values": True}], "n": 1}
    path = tmp_path / "f.buf"
    size = buffer_file.write(path, content, ARRAYS, compress=compress, durable=False)
    assert size == path.stat().st_size and path.read_bytes()[:8] == b"ELBUF001"
    assert [p.name for p in tmp_path.iterdir()] == ["f.buf"]          # no temporary file left
    got_content, got = buffer_file.read(path)
    assert got_content == content and len(got) == len(ARRAYS)
    for a, b in zip(ARRAYS, got):
        assert a.dtype == b.dtype and a.shape == b.shape and not b.flags.writeable
        np.testing.assert_array_equal(a, b)


def test_raw_buffers_are_aligned_views_of_the_file() -> None:
    raw = b"".join(buffer_file.encode({}, ARRAYS))
    _, arrays = buffer_file.decode(raw)
    base = np.frombuffer(raw, np.uint8).ctypes.data
    for a in arrays:
        if a.nbytes:
            assert (a.ctypes.data - base) % ALIGN == 0


def test_lz4_shrinks_compressible_buffers() -> None:
    big = [np.zeros(1 << 16, np.float32)]
    assert len(b"".join(buffer_file.encode({}, big, compress=True))) < len(b"".join(buffer_file.encode({}, big))) // 10


def test_damage_is_named(tmp_path: Path) -> None:
    raw = b"".join(buffer_file.encode({"x": 1}, ARRAYS[:2]))
    with pytest.raises(BufferFileError, match="f: truncated"):
        buffer_file.decode(raw[:-1], "f")
    with pytest.raises(BufferFileError, match="bad magic"):
        buffer_file.decode(b"X" + raw[1:], "f")
    with pytest.raises(BufferFileError, match="corrupt header"):
        buffer_file.decode(raw[:12] + b"[" + raw[13:], "f")
    with pytest.raises(BufferFileError, match="non-numeric"):
        buffer_file.encode({}, [np.array(["a"])])
    with pytest.raises(FileNotFoundError):
        buffer_file.read(tmp_path / "missing.buf")
