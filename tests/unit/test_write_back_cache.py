"""The sync window's write-back cache (psruntime.write_back_cache) against a model kept by hand: a
read returns the pulled row plus every delta the window applied to it, the oplog is the deltas'
sum per key, a key written before it was read gets its sum added when it is pulled, and clearing
forgets everything."""
from __future__ import annotations

import numpy as np
import pytest

from psruntime.write_back_cache import WriteBackCache

NUM_KEYS, ROW = 50, 3


def test_reads_see_the_windows_own_deltas_and_the_oplog_sums_them() -> None:
    cache = WriteBackCache(NUM_KEYS, ROW)
    server = np.arange(NUM_KEYS * ROW, dtype=np.float32).reshape(NUM_KEYS, ROW)
    keys = np.array([3, 7, 9], np.int64)
    assert cache.missing(keys).tolist() == [3, 7, 9]
    cache.fill(keys, server[keys])
    np.testing.assert_array_equal(cache.read(keys), server[keys])
    cache.apply(np.array([7, 9], np.int64), np.ones((2, ROW), np.float32))
    cache.apply(np.array([9], np.int64), np.full((1, ROW), 2, np.float32))
    assert cache.missing(np.array([3, 9, 11], np.int64)).tolist() == [11]
    np.testing.assert_array_equal(cache.read(np.array([9, 3], np.int64)), [server[9] + 3, server[3]])
    assert cache.dirty
    keys_out, sums = cache.take_oplog()
    assert keys_out.tolist() == [7, 9]                       # only the keys pushed to, sorted
    np.testing.assert_array_equal(sums, [[1] * ROW, [3] * ROW])
    assert len(cache) == 0 and not cache.dirty and cache.missing(keys).tolist() == [3, 7, 9]


def test_a_key_written_before_it_is_read_gets_its_sum_when_pulled() -> None:
    cache = WriteBackCache(NUM_KEYS, ROW)
    cache.apply(np.array([4], np.int64), np.full((1, ROW), 0.5, np.float32))
    assert cache.missing(np.array([4], np.int64)).tolist() == [4]      # not readable yet
    with pytest.raises(KeyError, match="not pulled"):
        cache.read(np.array([4], np.int64))
    cache.fill(np.array([4], np.int64), np.full((1, ROW), 10, np.float32))
    np.testing.assert_array_equal(cache.read(np.array([4], np.int64)), [[10.5] * ROW])
    cache.fill(np.array([4], np.int64), np.full((1, ROW), 99, np.float32))   # a second pull changes nothing
    np.testing.assert_array_equal(cache.read(np.array([4], np.int64)), [[10.5] * ROW])
    keys, sums = cache.take_oplog()
    assert keys.tolist() == [4] and sums.tolist() == [[0.5] * ROW]


def test_random_windows_match_a_dict_model() -> None:
    rng = np.random.default_rng(7)
    cache = WriteBackCache(NUM_KEYS, ROW)
    for _window in range(20):
        server = rng.standard_normal((NUM_KEYS, ROW)).astype(np.float32)
        local: dict[int, np.ndarray] = {}
        sums: dict[int, np.ndarray] = {}
        for _batch in range(6):
            keys = np.unique(rng.integers(0, NUM_KEYS, rng.integers(1, 15))).astype(np.int64)
            missing = cache.missing(keys)
            assert sorted(missing.tolist()) == sorted(k for k in keys.tolist() if k not in local)
            cache.fill(missing, server[missing])
            for k in missing.tolist():
                local[k] = server[k] + sums.get(k, 0)
            np.testing.assert_allclose(cache.read(keys), np.array([local[k] for k in keys.tolist()]), rtol=1e-6)
            # deltas, with repeated keys now and then, to some keys never read
            push = rng.integers(0, NUM_KEYS, rng.integers(1, 10)).astype(np.int64)
            if rng.random() < 0.5:
                push = np.unique(push)
            deltas = rng.standard_normal((len(push), ROW)).astype(np.float32)
            cache.apply(push, deltas)
            for k, d in zip(push.tolist(), deltas):
                sums[k] = sums.get(k, 0) + d
                if k in local:
                    local[k] = local[k] + d
        keys_out, sums_out = cache.take_oplog()
        assert keys_out.tolist() == sorted(sums)
        np.testing.assert_allclose(sums_out, np.array([sums[k] for k in sorted(sums)]), rtol=1e-5, atol=1e-6)
        assert len(cache) == 0


def test_deltas_not_a_row_per_key_or_keys_out_of_range_are_refused() -> None:
    # numpy would broadcast a (n, 1) delta over every column, and a key -1 would take the last
    # key's row: the cache refuses both, and the pulled rows stay as they were.
    cache = WriteBackCache(NUM_KEYS, ROW)
    keys = np.array([0, NUM_KEYS - 1], np.int64)
    cache.fill(keys, np.ones((2, ROW), np.float32))
    with pytest.raises(ValueError, match=r"deltas of shape \(2, 1\) for 2 keys"):
        cache.add_rows(cache.rows(keys), np.ones((2, 1), np.float32))
    with pytest.raises(ValueError, match=r"deltas of shape \(2, 1\) for 2 keys"):
        cache.apply(keys, np.ones((2, 1), np.float32))
    with pytest.raises(ValueError, match=r"deltas of shape \(3,\) for 1 keys"):
        cache.apply(np.array([0], np.int64), np.ones(3, np.float32))
    for bad in (-1, NUM_KEYS):
        with pytest.raises(ValueError, match=rf"keys must be integers in 0 .. {NUM_KEYS - 1}"):
            cache.apply(np.array([bad], np.int64), np.ones((1, ROW), np.float32))
    np.testing.assert_array_equal(cache.read(keys), np.ones((2, ROW), np.float32))
    assert not cache.dirty and len(cache) == 2
