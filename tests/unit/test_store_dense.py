"""Dense rows of the block store: many-key get / put / update as numpy ops, with the same semantics
as the per-key ops (missing keys, repeated keys, other layouts, copy-on-write, export / import)."""
from __future__ import annotations

import weakref

import numpy as np
import pytest

from psruntime.store.block_contents import BlockContents, RetiredValues
from psruntime.store.block_store import BlockArrays, BlockStore, StoreError
from psruntime.store.ownership_table import TABLE_KEYS, OwnershipTable, block_of, blocks_of_int_keys
from psruntime.store.store_requests import Groupings, group_by_block

NB = 4


def store() -> BlockStore:
    s = BlockStore(NB)
    for b in range(NB):
        s.create_block(b)
    return s


def per_block(keys: np.ndarray) -> list[tuple[int, np.ndarray]]:
    blocks = blocks_of_int_keys(keys, NB)
    return [(b, keys[blocks == b]) for b in sorted(set(blocks.tolist()))]


def gather_all(s: BlockStore, keys: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.full((len(keys), width), -1.0, np.float32)
    missing = np.zeros(len(keys), bool)
    blocks = blocks_of_int_keys(keys, NB)
    for b in set(blocks.tolist()):
        idx = np.flatnonzero(blocks == b)
        rows = out[idx]
        missing[idx] = s.gather(b, keys[idx], rows)
        out[idx] = rows
    return out, missing


def test_many_key_ops_match_per_key_semantics() -> None:
    s = store()
    keys = np.arange(0, 200, 2)  # even keys, written in two chunks (append path, then merge path)
    for chunk in (keys[50:], keys[:50]):
        for b, k in per_block(chunk):
            s.put_many(b, k, np.repeat(k[:, None], 3, axis=1).astype(np.float32))
    for k in (0, 98, 198):
        np.testing.assert_array_equal(s.get(k), [k, k, k])
    assert s.nbytes() == 100 * 12 and s.get(1) is None
    probe = np.array([4, 5, 6, 7])
    got, missing = gather_all(s, probe, 3)
    assert missing.tolist() == [False, True, False, True]
    np.testing.assert_array_equal(got[~missing], [[4] * 3, [6] * 3])
    np.testing.assert_array_equal(got[missing], -1.0)  # rows of missing keys are left as they were
    # update: held keys add, a missing key starts as its delta, repeated keys accumulate
    upd = np.array([4, 5, 4, 6])
    for b, _ in per_block(upd):
        sel = blocks_of_int_keys(upd, NB) == b
        s.check_update_many(b, "add", upd[sel], np.ones((sel.sum(), 3), np.float32))
        s.update_many(b, "add", upd[sel], np.ones((sel.sum(), 3), np.float32))
    np.testing.assert_array_equal(s.get(4), [6, 6, 6])
    np.testing.assert_array_equal(s.get(5), [1, 1, 1])
    np.testing.assert_array_equal(s.get(6), [7, 7, 7])
    for func, delta, want in (("max", 10.0, 10.0), ("min", 3.0, 3.0)):
        b = int(blocks_of_int_keys(np.array([8]), NB)[0])
        s.update_many(b, func, np.array([8]), np.full((1, 3), delta, np.float32))
        np.testing.assert_array_equal(s.get(8), [want] * 3)


def test_whole_block_add_in_place_and_copy_on_write_of_views() -> None:
    s = store()
    keys = np.arange(100)
    b, k = per_block(keys)[0]
    s.put_many(b, k, np.zeros((len(k), 2)))
    held = s.get(int(k[3]))       # a view, like a pull reply still being sent
    s.update_many(b, "add", k, np.ones((len(k), 2)))
    np.testing.assert_array_equal(held, [0, 0])  # not torn: the update went to a copy
    del held
    data = s.export_arrays(b).values
    addr = data.__array_interface__["data"][0]
    del data
    s.update_many(b, "add", k, np.ones((len(k), 2)))  # nobody holds a view: in place
    after = s.export_arrays(b).values
    assert after.__array_interface__["data"][0] == addr
    np.testing.assert_array_equal(after, 2.0)


def test_copy_on_write_reuses_the_array_it_replaced_once_released() -> None:
    """A second copy goes into an array an earlier copy replaced, once no view of it is alive;
    never while one is (the reader would see it torn)."""
    s = store()
    keys = np.arange(100)
    b, k = per_block(keys)[0]
    s.put_many(b, k, np.zeros((len(k), 2)))

    def owner() -> weakref.ref[np.ndarray]:
        values = s.export_arrays(b).values       # a view of the block's values array
        return weakref.ref(values.base)

    first = owner()
    held = s.get(int(k[0]))                              # a pull reply still being sent
    s.update_many(b, "add", k, np.ones((len(k), 2)))     # copy 1: into a fresh array
    second = owner()
    assert second() is not first()
    held2 = s.get(int(k[0]))                             # the next reply, while the first is held
    s.update_many(b, "add", k, np.ones((len(k), 2)))     # copy 2: `first` is still viewed: fresh
    third = owner()
    assert third() is not first() and third() is not second()
    np.testing.assert_array_equal(held, [0, 0])
    np.testing.assert_array_equal(held2, [1, 1])
    del held, held2                                      # both replies sent
    assert first() is not None and second() is not None  # kept for reuse, not freed
    held3 = s.get(int(k[0]))
    s.update_many(b, "add", k, np.ones((len(k), 2)))     # copy 3: into a released array
    assert owner()() is first()
    np.testing.assert_array_equal(held3, [2, 2])
    np.testing.assert_array_equal(s.export_arrays(b).values, 3.0)
    np.testing.assert_array_equal(s.get(int(k[-1])), [3, 3])


def test_retired_arrays_are_kept_within_a_byte_budget_oldest_dropped_first() -> None:
    row = np.zeros((4, 256), np.float32)                 # 4 KiB each
    retired = RetiredValues(max_total_bytes=3 * row.nbytes)
    arrays = [row.copy() for _ in range(4)]
    refs = [weakref.ref(a) for a in arrays]
    for a in arrays:
        retired.give(a)
    del a, arrays
    assert refs[0]() is None                             # over the budget: the oldest went
    assert all(r() is not None for r in refs[1:])
    taken = [retired.take(row) for _ in range(3)]
    assert {id(t) for t in taken} == {id(r()) for r in refs[1:]}   # each kept one, once
    assert retired.take(row) is None
    huge = np.zeros(4 * row.size, np.float32)            # over the whole budget: never kept
    huge_ref = weakref.ref(huge)
    retired.give(huge)
    del huge
    assert huge_ref() is None


def test_a_block_of_large_rows_starts_with_room_for_one_not_sixteen() -> None:
    """The first capacity is 16 rows only while they are small: a block holding one multi-MiB
    tensor gets an array of its size (a 16-row one was too large to keep for copy-on-write)."""
    s = store()
    (b, k), = per_block(np.array([3]))
    s.put_many(b, k, np.zeros((1, 1 << 20), np.float32))             # one 4 MiB row
    assert s.export_arrays(b).values.base.shape == (1, 1 << 20)
    (b, k), = per_block(np.array([5]))
    s.put_many(b, k, np.zeros((1, 2), np.float32))                   # small rows: 16 of them
    assert s.export_arrays(b).values.base.shape == (16, 2)


def test_other_layouts_and_str_keys_take_the_per_key_path() -> None:
    s = store()
    b = int(blocks_of_int_keys(np.array([1]), NB)[0])
    same = [k for k in range(100) if int(blocks_of_int_keys(np.array([k]), NB)[0]) == b][:3]
    s.put_many(b, np.array(same[:2]), np.ones((2, 4), np.float32))
    s.put(same[2], np.arange(6.0))          # another shape: kept beside the dense rows
    s.put(same[0], np.zeros(5))             # a dense key changes layout: moves out of the rows
    np.testing.assert_array_equal(s.get(same[0]), np.zeros(5))
    np.testing.assert_array_equal(s.get(same[1]), np.ones(4))
    # float64 deltas update float32 rows (same_kind cast); a key held with another shape is refused
    s.update_many(b, "add", np.array([same[1]]), np.ones((1, 4)))
    np.testing.assert_array_equal(s.get(same[1]), np.full(4, 2.0))
    assert s.get(same[1]).dtype == np.float32
    with pytest.raises(StoreError, match="shape"):
        s.check_update_many(b, "add", np.array([same[2]]), np.ones((1, 4), np.float32))
    with pytest.raises(StoreError, match="unknown update function"):
        s.check_update_many(b, "pow", np.array([same[1]]), np.ones((1, 4), np.float32))
    out = np.zeros((1, 4), np.float32)
    with pytest.raises(StoreError, match="shape"):
        s.gather(b, np.array([same[2]]), out)
    keys, arrays = s.export_block(b)
    assert sorted(map(str, keys)) == sorted(map(str, same))
    other = BlockStore(NB)
    other.import_block(b, keys, arrays)
    for k in same:
        np.testing.assert_array_equal(other.get(k), s.get(k))


def test_export_import_arrays_round_trip_and_bad_blocks() -> None:
    s = store()
    keys = np.arange(300)
    for b, k in per_block(keys):
        s.put_many(b, k, np.stack([k, -k]).T.astype(np.float64))
    b = block_of("w:bias", NB)
    s.put("w:bias", np.ones(2))   # a str key travels beside the dense rows
    data = s.export_arrays(b)
    other = BlockStore(NB)
    shuffled = np.random.default_rng(0).permutation(len(data.keys))
    other.import_arrays(b, BlockArrays(data.keys[shuffled], data.values[shuffled], data.other_keys,
                                       data.other_arrays))
    got = other.export_arrays(b)
    np.testing.assert_array_equal(got.keys, data.keys)
    np.testing.assert_array_equal(got.values, data.values)
    assert got.other_keys == data.other_keys
    wrong = (b + 1) % NB
    with pytest.raises(StoreError, match="does not hash to block"):
        other.import_arrays(wrong, data)
    with pytest.raises(StoreError, match="repeated dense keys"):
        other.import_arrays(b, BlockArrays(np.repeat(data.keys[:1], 2)[::-1].copy(), np.zeros((2, 2))))
    with pytest.raises(StoreError, match="dense keys but values"):
        other.import_arrays(b, BlockArrays(data.keys, data.values[:-1]))
    np.testing.assert_array_equal(other.export_arrays(b).keys, data.keys)  # the bad imports changed nothing


def test_group_by_block_and_owner_index_cache() -> None:
    blocks = np.array([3, 1, 3, 0, 1])
    groups = group_by_block(blocks, 4)
    assert [(b, idx.tolist()) for b, idx in groups] == [(0, [3]), (1, [1, 4]), (3, [0, 2])]
    assert group_by_block(np.array([2, 2]), 4) == [(2, None)]
    many = np.random.default_rng(1).integers(0, 200, 1000)
    big = group_by_block(many, 200)
    assert sorted(np.concatenate([i for _, i in big]).tolist()) == list(range(1000))
    assert all((many[i] == b).all() for b, i in big)
    t = OwnershipTable.round_robin(4, ["a", "b"])
    names, idx = t.owner_index()
    assert names == ["a", "b"] and idx.tolist() == [0, 1, 0, 1]
    assert t.owner_index()[1] is idx   # cached while the owners stay the same
    t.note_owner(1, "c", "h:3")
    names, idx = t.owner_index()
    assert [names[i] for i in idx] == ["a", "c", "a", "b"]


def test_block_ids_from_the_key_table_are_the_hash() -> None:
    rng = np.random.default_rng(3)
    keys = np.concatenate([rng.integers(0, 5000, 300), [0, TABLE_KEYS - 1, TABLE_KEYS, 2 ** 40, -7]]).astype(np.int64)
    for nb in (1, 4, 7, 64):
        # Keys in the table's range, past it and negative (hashed) alike: block_of per key.
        assert blocks_of_int_keys(keys, nb).tolist() == [block_of(int(k), nb) for k in keys]
        assert blocks_of_int_keys(keys[:10], nb).tolist() == [block_of(int(k), nb) for k in keys[:10]]
    assert blocks_of_int_keys(np.zeros(0, np.int64), 4).tolist() == []


def test_a_request_naming_every_key_of_a_block_reads_and_adds_like_a_lookup() -> None:
    s, ref = store(), store()
    keys = np.arange(40, dtype=np.int64)
    vals = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    for b, k in per_block(keys):
        s.put_many(b, k, vals[k])
        ref.put_many(b, k, vals[k])
    b, held = per_block(keys)[0]
    # Every key of block b, in order (the covering path) against the same keys less one (the lookup path).
    out = np.full((len(held) + 2, 3), -1.0, np.float32)
    at = np.arange(2, len(held) + 2)
    assert not s.gather(b, held, out, at=at).any()
    np.testing.assert_array_equal(out[2:], vals[held])
    np.testing.assert_array_equal(out[:2], -1.0)
    part = np.full((len(held) - 1, 3), -1.0, np.float32)
    assert not s.gather(b, held[1:], part, at=np.arange(len(held) - 1)).any()
    np.testing.assert_array_equal(part, vals[held[1:]])
    deltas = np.ones((len(held), 3), np.float32)
    s.check_update_many(b, "add", held, deltas)
    s.update_many(b, "add", held, deltas)                    # covering: one in-place add
    ref.update_many(b, "add", held[::-1].copy(), deltas)     # same keys out of order: the lookup path
    np.testing.assert_array_equal(s.export_arrays(b).values, ref.export_arrays(b).values)
    # A delta of another row shape is refused only where the block holds a key it names.
    with pytest.raises(StoreError, match="have shape"):
        s.check_update_many(b, "add", held[:1], np.ones((1, 4), np.float32))
    s.check_update_many(b, "add", np.array([10_000], np.int64), np.ones((1, 4), np.float32))


def test_groupings_reuse_the_grouping_of_an_equal_key_array_only() -> None:
    cache = Groupings()
    received = np.arange(40, dtype=np.int64)          # as if a view of a receive buffer
    first = cache.of(received, NB)
    expected = group_by_block(blocks_of_int_keys(received, NB), NB)
    assert [(b, i.tolist()) for b, i in first] == [(b, i.tolist()) for b, i in expected]
    assert cache.of(np.arange(40, dtype=np.int64), NB) is first      # equal keys: the same grouping
    received[:] = np.arange(40, 80)                    # the buffer reused for the next frame
    other = cache.of(received, NB)
    assert other is not first
    assert [(b, i.tolist()) for b, i in other] == \
        [(b, i.tolist()) for b, i in group_by_block(blocks_of_int_keys(np.arange(40, 80), NB), NB)]
    assert cache.of(received[:10], NB) is not other and cache.of(received[:10], 8) is not other


def test_a_block_remembers_a_read_only_covering_key_array_until_its_keys_change() -> None:
    blk = BlockContents()
    held = np.arange(0, 20, 2, dtype=np.int64)
    blk.insert(held, np.ones((len(held), 3), np.float32))
    asked = held.copy()
    asked.flags.writeable = False
    assert blk.covers(asked) and blk.covers(asked)
    # A key added: the same array no longer covers the block (the memo is per version of its keys).
    blk.insert(np.array([7], np.int64), np.ones((1, 3), np.float32))
    assert not blk.covers(asked)
    blk.remove(7)                                   # the keys are what they were: covered again
    assert blk.covers(asked)
    blk.remove(18)
    assert not blk.covers(asked) and blk.covers(asked[:-1].copy())
    # A writable array is compared every time: changed in place, it stops covering.
    mutable = held[:-1].copy()
    assert blk.covers(mutable)
    mutable[0] = 1
    assert not blk.covers(mutable)


def test_a_request_after_its_blocks_keys_changed_reads_and_adds_by_lookup() -> None:
    s = store()
    keys = np.arange(40, dtype=np.int64)
    vals = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    for b, k in per_block(keys):
        s.put_many(b, k, vals[k])
    b, held = per_block(keys)[0]
    asked = held.copy()
    asked.flags.writeable = False
    out = np.zeros((len(held), 3), np.float32)
    assert not s.gather(b, asked, out).any()          # covering, remembered
    extra = next(k for k in range(40, 10_000) if block_of(k, NB) == b)
    s.put_many(b, np.array([extra], np.int64), np.full((1, 3), 7.0, np.float32))
    s.update_many(b, "add", asked, np.ones((len(held), 3), np.float32))
    out = np.zeros((len(held) + 1, 3), np.float32)
    both = np.sort(np.append(held, extra))
    assert not s.gather(b, both, out).any()
    np.testing.assert_array_equal(out[both != extra], vals[held] + 1)     # the add reached only its keys
    np.testing.assert_array_equal(out[both == extra], 7.0)


def test_groupings_hand_out_each_blocks_keys_read_only_and_a_new_dict_per_grouping() -> None:
    cache = Groupings()
    keys = np.arange(40, dtype=np.int64)
    groups = cache.of(keys, NB)
    parts = cache.part_keys
    assert sorted(parts) == [b for b, _ in groups]
    for b, idx in groups:
        np.testing.assert_array_equal(parts[b], keys if idx is None else keys[idx])
        assert not parts[b].flags.writeable
    cache.of(keys.copy(), NB)
    assert cache.part_keys is parts                       # reused with the grouping
    cache.of(np.arange(40, 80, dtype=np.int64), NB)
    assert cache.part_keys is not parts and sorted(parts) == [b for b, _ in groups]   # the old one kept
