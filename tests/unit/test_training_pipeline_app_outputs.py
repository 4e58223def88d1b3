"""What an app hands the worker loop is checked before the runtime uses it (psruntime.apps.base
OutputCheck): compute's deltas must be (len(keys), key_length) for integer keys in
[0, num_keys), and keys_for_batch's keys in range too. Otherwise a sync window broadcast a (n, 1)
delta over the row, a key -1 took the last key's row and a key >= num_keys became a phantom key
in the store; now the step fails with AppOutputError naming the app and the fault, before the
mini-batch pushes anything (per mini-batch and in sync windows alike, and in the single-process
baseline). A user app's is answered to the AM as UserCodeError."""
from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from psruntime.app_role import AppRole
from psruntime.apps.base import AppOutputError, Batch, KeyValues, OutputCheck, PSApp, StepContext
from psruntime.apps.registry import UserCodeError, create_app
from psruntime.apps.single_process import DenseModel, train_single_process
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController
from psruntime.store.store_client import StoreClient
from psruntime.training_pipeline import TrainingPipeline, init_blocks, init_model, pull_key_values
from psruntime.wire.dataplane import DataPlaneClient
from store_cluster import executor_cluster


class FaultyApp:
    """The tiny MLR app, with one fault: in compute's deltas ("narrow": a (n, 1) delta where
    key_length is 20; "key-1" / "key=num_keys": one more key, out of range, sorted in), in
    keys_for_batch's keys ("batch-key-1", "batch-key=num_keys"), or "copied-keys": deltas for a
    copy of the pulled keys (fine: only not the pulled array itself)."""

    def __init__(self, app: PSApp, fault: str) -> None:
        self._app, self.fault = app, fault

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app, name)

    def _bad_keys(self, keys: np.ndarray, where: str) -> np.ndarray:
        if self.fault == f"{where}-1":
            return np.r_[np.int64(-1), keys]
        if self.fault == f"{where}=num_keys":
            return np.r_[keys, np.int64(self._app.num_keys)]
        return keys

    def keys_for_batch(self, batch: Batch) -> np.ndarray:
        return self._bad_keys(self._app.keys_for_batch(batch), "batch-key")

    def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
        d = self._app.compute(batch, params, ctx)
        if self.fault == "narrow":
            return KeyValues(d.keys, d.values[:, :1].copy())
        if self.fault == "copied-keys":
            return KeyValues(d.keys.copy(), d.values)
        keys = self._bad_keys(d.keys, "key")
        if len(keys) == len(d.keys):
            return d
        extra = np.ones((1, d.values.shape[1]), np.float32)
        values = np.vstack([extra, d.values] if keys[0] < 0 else [d.values, extra])
        return KeyValues(keys, values)


MESSAGES = {
    "narrow": r"app 'mlr': compute returned values of shape \(\d+, 1\) for \d+ keys, not \(\d+, 20\)",
    "key-1": r"app 'mlr': compute returned deltas with 1 of \d+ keys outside 0 .. num_keys-1 \(min -1",
    "key=num_keys": r"app 'mlr': compute returned deltas with 1 of \d+ keys outside 0 .. num_keys-1 .*max 20;",
    "batch-key-1": r"app 'mlr': keys_for_batch returned 1 of \d+ keys outside 0 .. num_keys-1 \(min -1",
    "batch-key=num_keys": r"app 'mlr': keys_for_batch returned 1 of \d+ keys outside .*max 20;",
}


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[list[Executor], MigrationController, DataPlaneClient]]:
    async with executor_cluster(2, 8) as c:
        yield c


@pytest.mark.parametrize("sync_batches", [1, 3])
@pytest.mark.parametrize("fault", list(MESSAGES))
async def test_a_faulty_app_output_fails_the_step_before_anything_is_pushed(cluster, fault: str,
                                                                             sync_batches: int) -> None:
    _, ctl, dp = cluster
    app = create_app("mlr", preset="tiny")
    assert (app.num_keys, app.key_length) == (20, 20)
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    blocks = app.generate_partition(0, 1).blocks
    pipeline = TrainingPipeline()
    pipeline.sync_batches = sync_batches
    with pytest.raises(AppOutputError, match=MESSAGES[fault]):
        await pipeline.run_batches(FaultyApp(app, fault), store, blocks, StepContext(0, 1), limit=6)
    await store.flush()
    # The model is as initialised (the last key's row included), and no key beyond it appeared.
    model = await pull_key_values(store, app.model_keys(), app.key_length)
    np.testing.assert_array_equal(model.values, app.init_value(app.model_keys()))
    _, found = await store.pull_array(np.array([app.num_keys], np.int64), (app.key_length,), np.float32)
    assert not found.any()


@pytest.mark.parametrize("sync_batches", [1, 3])
async def test_deltas_for_a_copy_of_the_pulled_keys_train_as_the_pulled_keys_do(cluster, sync_batches: int) -> None:
    # Not the fast path (`deltas.keys is params.keys`): the keys are checked, and accepted.
    _, ctl, dp = cluster
    app = create_app("mlr", preset="tiny")
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    blocks = app.generate_partition(0, 1).blocks
    pipeline = TrainingPipeline()
    pipeline.sync_batches = sync_batches
    times = await pipeline.run_batches(FaultyApp(app, "copied-keys"), store, blocks, StepContext(0, 1), limit=6)
    ref = DenseModel(app)
    batches = [b for block in app.generate_partition(0, 1).blocks for b in app.batches(block)][:times.batches]
    for b in batches:
        ref.push(app.compute(b, ref.pull(app.keys_for_batch(b)), StepContext(0, 1)))
    trained = await pull_key_values(store, app.model_keys(), app.key_length)
    np.testing.assert_allclose(trained.values, ref.values, rtol=1e-4, atol=1e-5)


async def test_init_block_deltas_are_checked_too(cluster) -> None:
    _, ctl, dp = cluster
    app = create_app("mlr", preset="tiny")

    class BadInit(FaultyApp):
        def init_block(self, block: Any) -> KeyValues:
            return KeyValues(np.array([3, 20], np.int64), np.ones((2, 20), np.float32))

    with pytest.raises(AppOutputError, match=r"init_block returned deltas with 1 of 2 keys outside"):
        await init_blocks(StoreClient(ctl.table, dp), BadInit(app, ""), app.generate_partition(0, 1).blocks)


@pytest.mark.parametrize("fault", list(MESSAGES))
def test_the_single_process_baseline_checks_as_the_workers_do(fault: str) -> None:
    app = create_app("mlr", preset="tiny")
    with pytest.raises(AppOutputError, match=MESSAGES[fault]):
        train_single_process(FaultyApp(app, fault), max_epochs=1, evaluate=False)  # type: ignore[arg-type]


def test_the_check_refuses_what_is_not_integer_keys_or_a_key_values() -> None:
    check = OutputCheck(create_app("mlr", preset="tiny"))
    with pytest.raises(AppOutputError, match=r"keys_for_batch returned keys that are not a 1-D integer array "
                                             r"\(a 1-D float64 array\)"):
        check.batch_keys(np.array([1.0, 2.0]))
    with pytest.raises(AppOutputError, match=r"compute must return a KeyValues or None, got tuple"):
        check.deltas((np.arange(2), np.zeros((2, 20), np.float32)), None)  # type: ignore[arg-type]
    kv = KeyValues(np.array([0, 19], np.uint32), np.zeros((2, 20), np.float32))
    assert check.deltas(kv, None) is kv and check.deltas(None, None) is None
    keys = np.arange(5, dtype=np.int64)
    kv = KeyValues(keys, np.zeros((5, 20), np.float32))
    kv.values = np.zeros((4, 20), np.float32)        # changed after it was built
    with pytest.raises(AppOutputError, match=r"values of shape \(4, 20\) for 5 keys, not \(5, 20\)"):
        check.deltas(kv, keys)


def test_a_user_apps_faulty_output_is_answered_as_user_code_error() -> None:
    role = AppRole(SimpleNamespace(executor_id="e7"))  # type: ignore[arg-type]
    role.app, role.app_name = create_app("mlr", preset="tiny"), "mymodel:MyApp"
    err = role._user_error(AppOutputError("app 'mine': compute returned values of shape (3, 1) ..."))
    assert isinstance(err, UserCodeError)
    assert str(err).startswith("app mymodel:MyApp on e7: AppOutputError: app 'mine': compute returned values")
