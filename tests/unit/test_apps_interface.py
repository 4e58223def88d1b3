"""App interface: registry, config validation, block serialisation, determinism by seed and partition."""
from __future__ import annotations

import numpy as np
import pytest

from psruntime.apps.base import AppConfigError, KeyValues, ObjectivePart
from psruntime.apps.blocks import BlockFormatError, DataBlock
from psruntime.apps.registry import APP_NAMES, create_app, get_app

TINY_OVERRIDES = {  # a few blocks per app so partitions of 3 differ in size
    "mlr": {"num_samples": 700, "rows_per_block": 100},
    "lasso": {"num_samples": 700, "rows_per_block": 100},
    "nmf": {"num_users": 350, "rows_per_block": 50},
    "lda": {"num_docs": 140, "rows_per_block": 20},
}


def _app(name: str, **spec):
    return create_app(name, {**TINY_OVERRIDES[name], **spec}, preset="tiny")


def _assert_blocks_equal(a: DataBlock, b: DataBlock) -> None:
    assert (a.app, a.block_index, a.row_start, a.num_rows) == (b.app, b.block_index, b.row_start, b.num_rows)
    assert a.data.keys() == b.data.keys() and a.state.keys() == b.state.keys()
    for name in a.data:
        np.testing.assert_array_equal(a.data[name], b.data[name])
    for name in a.state:
        np.testing.assert_array_equal(a.state[name], b.state[name])


def test_registry_knows_the_four_apps_and_names_choices_on_error():
    assert set(APP_NAMES) == {"mlr", "nmf", "lda", "lasso"}
    for name in APP_NAMES:
        assert get_app(name).name == name
    with pytest.raises(AppConfigError, match="unknown app 'svm'.*mlr"):
        get_app("svm")


@pytest.mark.parametrize("name,hparams,field", [
    ("mlr", {"learning_rate": 0}, "learning_rate"),
    ("mlr", {"batch_size": -1}, "batch_size"),
    ("lasso", {"l1": -0.5}, "l1"),
    ("nmf", {"rank": 0}, "rank"),
    ("lda", {"alpha": 0.0}, "alpha"),
    ("lda", {"num_topics": "five"}, "num_topics"),
])
def test_bad_hyperparameters_are_refused_naming_the_field(name, hparams, field):
    with pytest.raises(AppConfigError, match=field):
        create_app(name, hparams=hparams)


def test_bad_spec_fields_and_presets_are_refused():
    with pytest.raises(AppConfigError, match="nnz_per_sample must be <= num_features"):
        create_app("mlr", {"num_features": 10, "nnz_per_sample": 20})
    with pytest.raises(AppConfigError, match="observed_fraction"):
        create_app("nmf", {"observed_fraction": 1.5})
    with pytest.raises(AppConfigError, match="unknown field `bogus`"):
        create_app("lasso", {"bogus": 1})
    with pytest.raises(AppConfigError, match="unknown preset 'huge'"):
        create_app("lda", preset="huge")


@pytest.mark.parametrize("name", APP_NAMES)
def test_partition_i_of_n_equals_the_same_blocks_of_the_full_data(name):
    app = _app(name)
    full = app.generate_partition(0, 1).blocks
    assert len(full) == app.num_blocks >= 5
    parts = [app.generate_partition(i, 3) for i in range(3)]
    sizes = [len(p.blocks) for p in parts]
    assert sum(sizes) == len(full) and max(sizes) - min(sizes) <= 1
    joined = [b for p in parts for b in p.blocks]
    for a, b in zip(joined, full):
        _assert_blocks_equal(a, b)
    assert [b.row_start for b in full] == [i * app.rows_per_block for i in range(len(full))]
    assert sum(b.num_rows for b in full) == app.num_rows


@pytest.mark.parametrize("name", APP_NAMES)
def test_generation_is_deterministic_by_seed_and_heldout_is_separate(name):
    a, b, c = _app(name), _app(name), _app(name, seed=7)
    _assert_blocks_equal(a.generate_block(2), b.generate_block(2))
    first = next(iter(a.ENTRY_FIELDS))
    assert not np.array_equal(a.generate_block(0).data[first][:50], c.generate_block(0).data[first][:50])
    held = a.generate_heldout()
    assert sum(h.num_rows for h in held) == a.num_heldout_rows
    assert not np.array_equal(held[0].data[first][:50], a.generate_block(0).data[first][:50])


@pytest.mark.parametrize("name", APP_NAMES)
def test_model_layout_and_init_are_deterministic_per_key(name):
    app = _app(name)
    keys = app.model_keys()
    assert keys.dtype == np.int64 and len(keys) == app.num_keys
    full = app.init_value(keys)
    assert full.shape == (app.num_keys, app.key_length) and full.dtype == np.float32
    some = np.array([3, 1, app.num_keys - 1], dtype=np.int64)
    np.testing.assert_array_equal(app.init_value(some), full[some])
    assert app.model_nbytes() == full.nbytes
    assert app.data_nbytes() > 0
    d = app.describe()
    assert d["app"] == name and d["num_keys"] == app.num_keys


@pytest.mark.parametrize("name", APP_NAMES)
def test_batch_keys_are_sorted_unique_and_cover_the_batch(name):
    app = _app(name)
    block = app.generate_block(0)
    app.init_block(block)
    batches = list(app.batches(block))
    assert sum(b.size for b in batches) == block.num_rows
    keys = app.keys_for_batch(batches[0])
    assert keys.dtype == np.int64 and np.all(np.diff(keys) > 0)
    assert keys.min() >= 0 and keys.max() < app.num_keys
    ok = app.objective_keys(block)
    assert np.all(np.diff(ok) > 0) if len(ok) > 1 else True


@pytest.mark.parametrize("name", APP_NAMES)
def test_block_roundtrips_through_numpy_buffers_with_its_state(name):
    app = _app(name)
    block = app.generate_block(1)
    app.init_block(block)
    header, buffers = block.to_buffers()
    # what the data plane or the spill would carry: raw bytes, no pickle
    restored = DataBlock.from_buffers(header, [bytes(memoryview(b)) for b in buffers])
    _assert_blocks_equal(block, restored)
    assert restored.nbytes == block.nbytes
    for arr in restored.state.values():
        assert arr.flags.writeable   # the worker keeps updating state after a move


def test_block_from_bad_buffers_names_the_problem():
    block = _app("mlr").generate_block(0)
    header, buffers = block.to_buffers()
    with pytest.raises(BlockFormatError, match="arrays but"):
        DataBlock.from_buffers(header, buffers[:-1])
    with pytest.raises(BlockFormatError, match="data.labels"):
        DataBlock.from_buffers(header, buffers[:-1] + [buffers[-1][:-1]])
    bad = dict(header, arrays=[["data", "x", "|O", [1]]])
    with pytest.raises(BlockFormatError, match="non-numeric"):
        DataBlock.from_buffers(bad, [b"\0" * 8])
    with pytest.raises(BlockFormatError, match="missing or has a bad field"):
        DataBlock.from_buffers({"app": "mlr"}, [])


def test_key_values_and_objective_parts():
    kv = KeyValues(np.array([2, 5, 9]), np.zeros((3, 4), np.float32))
    np.testing.assert_array_equal(kv.rows_of(np.array([9, 2])), [2, 0])
    with pytest.raises(KeyError):
        kv.rows_of(np.array([4]))
    with pytest.raises(ValueError, match="same length"):
        KeyValues(np.array([1, 2]), np.zeros((3, 4)))
    assert ObjectivePart(1.5, 2) + ObjectivePart(2.5, 3) == ObjectivePart(4.0, 5)


def test_convergence_rule_uses_relative_change_and_epoch_limit():
    app = create_app("mlr", hparams={"convergence_threshold": 0.01, "max_epochs": 5})
    assert not app.is_converged([1.0])
    assert not app.is_converged([1.0, 0.9])
    assert app.is_converged([1.0, 0.995])
    assert not app.is_converged([1.0, float("nan")])
    assert app.is_converged([5.0, 4.0, 3.0, 2.0, 1.0])
    lda = create_app("lda", hparams={"convergence_threshold": 0.01})
    assert lda.maximize and lda.is_converged([-4.0, -3.99])
