"""Block store operations, key hashing and the ownership table."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from psruntime.store.block_store import BlockStore, StoreError
from psruntime.store.ownership_table import (OwnershipError, OwnershipTable, block_of, blocks_of_int_keys,
                                       key_hash)

NB = 16


def full_store() -> BlockStore:
    s = BlockStore(NB)
    for b in range(NB):
        s.create_block(b)
    return s


def test_put_get_copies_and_update_funcs() -> None:
    s = full_store()
    src = np.arange(4, dtype=np.float32)
    s.put(3, src)
    src[0] = 100  # the store kept its own copy
    np.testing.assert_array_equal(s.get(3), [0, 1, 2, 3])
    s.update(3, "add", np.ones(4, np.float32))
    np.testing.assert_array_equal(s.get(3), [1, 2, 3, 4])
    s.update(3, "max", np.array([0, 5, 0, 5], np.float32))
    np.testing.assert_array_equal(s.get(3), [1, 5, 3, 5])
    s.update(3, "min", np.array([0, 9, 9, 2], np.float32))
    np.testing.assert_array_equal(s.get(3), [0, 5, 3, 2])
    assert s.get("absent") is None


def test_update_of_missing_key_starts_from_delta() -> None:
    s = full_store()
    for func in ("add", "max", "min"):
        s.update(f"k-{func}", func, np.array([-2.0, 3.0]))
        np.testing.assert_array_equal(s.get(f"k-{func}"), [-2.0, 3.0])


def test_bad_updates_change_nothing() -> None:
    s = full_store()
    s.put(1, np.zeros(3, np.int32))
    with pytest.raises(StoreError, match="unknown update function 'mul'"):
        s.update(1, "mul", np.ones(3, np.int32))
    with pytest.raises(StoreError, match="shape"):
        s.update(1, "add", np.ones(4, np.int32))
    with pytest.raises(StoreError, match="float64"):
        s.check_update(1, "add", np.ones(3))
    with pytest.raises(StoreError, match="must be an int or a str"):
        s.put(1.5, np.ones(1))  # type: ignore[arg-type]
    np.testing.assert_array_equal(s.get(1), [0, 0, 0])


def test_block_not_held_and_export_import_round_trip() -> None:
    s = BlockStore(NB)
    b = block_of(42, NB)
    with pytest.raises(StoreError, match="not held"):
        s.put(42, np.ones(2))
    s.create_block(b)
    s.put(42, np.ones(2))
    keys, arrays = s.export_block(b)
    other = BlockStore(NB)
    other.import_block(b, keys, arrays)
    np.testing.assert_array_equal(other.get(42), [1.0, 1.0])
    assert other.block_nbytes(b) == 16
    wrong = (b + 1) % NB
    with pytest.raises(StoreError, match="does not hash to block"):
        other.import_block(wrong, [42], [np.ones(2)])


def test_hash_is_stable_across_processes_and_vectorised() -> None:
    keys = [0, 1, 2, 12345, 2**40, "w:layer1", "ünïcode"]
    here = [key_hash(k) for k in keys]
    code = ("from psruntime.store.ownership_table import key_hash; "
            f"print([key_hash(k) for k in {keys!r}])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""})
    assert out.stdout.strip() == str(here)
    ints = np.arange(10_000)
    assert blocks_of_int_keys(ints, NB).tolist() == [block_of(int(k), NB) for k in ints]
    counts = np.bincount(blocks_of_int_keys(ints, NB), minlength=NB)
    assert counts.min() > 10_000 / NB * 0.8  # hashed ranges spread keys evenly


def test_ownership_table_versions_and_wire() -> None:
    t = OwnershipTable.round_robin(4, ["a", "b"], {"a": "h:1", "b": "h:2"})
    assert t.owners == ["a", "b", "a", "b"] and t.blocks_owned_by("a") == [0, 2]
    copy = t.copy()
    assert t.assign([1], "a") == 1
    assert copy.replace_if_newer(OwnershipTable.from_wire(t.to_wire()))
    assert copy.owners == ["a", "a", "a", "b"]
    assert not copy.replace_if_newer(OwnershipTable.round_robin(4, ["c"]))  # older version ignored
    with pytest.raises(OwnershipError, match="out of range"):
        t.assign([7], "a")
    assert t.version == 1  # the bad assign changed nothing
    with pytest.raises(OwnershipError, match="no data-plane address"):
        t.address_of("zz")
    for bad, msg in [({"owners": []}, "missing field 'num_blocks'"),
                     ({"num_blocks": 2, "owners": [1, 2], "version": 0}, "'owners'"),
                     ({"num_blocks": 2, "owners": ["a"], "version": 0}, "1 entries for 2 blocks")]:
        with pytest.raises(OwnershipError, match=msg):
            OwnershipTable.from_wire(bad)


def test_update_is_copy_on_write_while_a_reader_holds_the_value() -> None:
    s = full_store()
    s.put(5, np.zeros(3))
    s.update(5, "add", np.ones(3))
    held = s.get(5)  # e.g. a pull reply the transport is still sending
    s.update(5, "add", np.ones(3))
    np.testing.assert_array_equal(held, [1, 1, 1])  # not torn by the later update
    np.testing.assert_array_equal(s.get(5), [2, 2, 2])
    del held
    before = s.get(5)
    addr = before.__array_interface__["data"][0]
    del before
    s.update(5, "add", np.ones(3))  # nobody holds it now: updated in place, no allocation
    assert s.get(5).__array_interface__["data"][0] == addr
