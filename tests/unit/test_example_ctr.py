"""examples/ctr.py, a user's model written against elastane.app_api only: click-through-rate
logistic regression over hashed categorical features with a known ground truth.

Unit level: it trains in the single-process baseline to a held-out AUC and log-loss near the true
model's (stated tolerances below, measured at `tiny`: AUC 0.790 vs 0.802, log-loss 0.513 vs 0.500),
its data is deterministic by (seed, block) and by partition, it passes the interface contract the
built-in apps pass (tests/unit/test_apps_interface.py's checks, on this app), a simulated 3-worker BSP
split converges like one process (tests/unit/test_apps_learning.py's run_bsp), and the job's
"ctr:CTRApp" name loads it through the registry from the working dir, as an executor does.

Cluster level: submitted as a user would (`elastane ps submit --app ctr:CTRApp --py-files
examples/ctr.py`), the job SUCCEEDS with a held-out AUC near the true model's (stated: within
0.03, a little wider than one process's 0.02 for the staler BSP updates of several workers) after
an EPS scale-out (+1 worker) while it trains.
"""
from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import FINAL_STATES, app_post_mortem, get_app, pids_with_env, rest, wait_app
from ps_am_status import final_status, live_status
from polling import wait_until
from protocol import container_env
from psruntime.apps.base import AppConfigError, KeyValues, PSApp
from psruntime.apps.blocks import DataBlock
from psruntime.apps.registry import create_app
from psruntime.apps.single_process import DenseModel, train_single_process
from test_apps_interface import _assert_blocks_equal
from test_apps_learning import run_bsp

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CTR_PATH = EXAMPLES / "ctr.py"

# Stated tolerances (tiny, seed 0; measured: AUC 0.790 vs 0.802, log-loss 0.513 vs 0.500).
AUC_TOLERANCE = 0.02
LOG_LOSS_TOLERANCE = 0.025


def _load_ctr():
    """examples/ctr.py as the module `ctr` (what `--app ctr:CTRApp` imports)."""
    if "ctr" in sys.modules and getattr(sys.modules["ctr"], "__file__", None) == str(CTR_PATH):
        return sys.modules["ctr"]
    spec = importlib.util.spec_from_file_location("ctr", CTR_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ctr"] = module
    spec.loader.exec_module(module)
    return module


ctr = _load_ctr()
CTRApp = ctr.CTRApp


def _app(**spec):
    """A few blocks so partitions of 3 differ in size (like the interface tests' overrides)."""
    return CTRApp.from_config({"num_samples": 700, "rows_per_block": 100, "num_heldout": 300, **spec}, preset="tiny")


# ----------------------------------------------------------------- public API only

def test_the_example_imports_only_numpy_msgspec_and_the_public_api():
    tree = ast.parse(CTR_PATH.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] if a.name != "elastane.app_api" else a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= {"__future__", "functools", "typing", "msgspec", "numpy", "elastane.app_api"}, imported
    assert issubclass(CTRApp, PSApp) and not CTRApp.__abstractmethods__


# ----------------------------------------------------------------- learning

def test_ctr_trains_single_process_to_near_the_true_models_auc_and_log_loss():
    app = CTRApp.from_config(preset="tiny")
    result, model = train_single_process(app)
    m = result.metrics
    # stated: held-out AUC within 0.02 of the true model's, log-loss within 0.025 of the true model's
    assert m["auc"] >= m["true_model_auc"] - AUC_TOLERANCE, m
    assert m["log_loss"] <= m["true_model_log_loss"] + LOG_LOSS_TOLERANCE, m
    assert m["true_model_auc"] >= 0.75      # the labels carry signal: the task is not trivial or noise
    assert m["log_loss"] < m["base_rate_log_loss"] - 0.08
    assert result.converged and len(result.epochs) <= app.hparams.max_epochs
    assert result.initial_objective == pytest.approx(np.log(2))   # all-zero model: p = 0.5
    objs = [result.initial_objective] + [e.objective for e in result.epochs]
    assert all(b < a for a, b in zip(objs, objs[1:]))
    untrained = app.evaluate(app.init_value(app.model_keys()), app.generate_heldout())
    assert untrained["auc"] == pytest.approx(0.5) and untrained["log_loss"] == pytest.approx(np.log(2))
    # the true weights put in the model layout score exactly the true model's figures
    truth = np.zeros(app.num_keys * app.key_length, np.float32)
    truth[: app.num_weights] = app.true_weights
    scored = app.evaluate(truth.reshape(app.num_keys, app.key_length), app.generate_heldout())
    assert scored["auc"] == pytest.approx(m["true_model_auc"], abs=1e-9)
    assert scored["log_loss"] == pytest.approx(m["true_model_log_loss"], rel=1e-5)


def test_bsp_split_over_three_workers_converges_like_single_process():
    app = CTRApp.from_config(preset="tiny")
    epochs = 4
    single, _ = train_single_process(app, max_epochs=epochs, evaluate=False)
    bsp = run_bsp(app, epochs)
    s_hist = [single.initial_objective] + [e.objective for e in single.epochs]
    assert bsp[0] == pytest.approx(s_hist[0], rel=1e-9)
    # stated, as for the built-in apps: >= 80% of the single-process improvement in as many epochs
    assert bsp[-1] < bsp[0] and abs(bsp[-1] - bsp[0]) >= 0.8 * abs(s_hist[-1] - s_hist[0])


def test_predict_gives_click_probabilities_that_score_like_evaluate():
    app = CTRApp.from_config(preset="tiny")
    _, model = train_single_process(app, max_epochs=3, evaluate=False)
    heldout = app.generate_heldout()
    probs, labels = [], []
    for block in heldout:
        params = model.pull(app.objective_keys(block))
        p = app.predict(block, params)
        assert p.shape == (block.num_rows,) and np.all((p > 0) & (p < 1))
        # only the block's keys are needed, and more keys change nothing
        np.testing.assert_allclose(p, app.predict(block, model.pull(app.model_keys())))
        probs.append(p)
        labels.append(block.data["labels"])
    p, y = np.concatenate(probs), np.concatenate(labels)
    m = app.evaluate(model.values, heldout)
    assert ctr.auc(p, y) == pytest.approx(m["auc"], abs=1e-12)
    assert float(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p)))) == pytest.approx(m["log_loss"], rel=1e-6)


def test_auc_matches_the_pairwise_definition_with_ties():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 6, 300).astype(float)   # many ties
    labels = rng.random(300) < 0.3
    pos, neg = scores[labels], scores[~labels]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    assert ctr.auc(scores, labels) == pytest.approx(pairwise, abs=1e-12)
    assert ctr.auc(np.arange(4.0), np.array([0, 0, 1, 1])) == 1.0
    assert ctr.auc(np.arange(3.0), np.ones(3)) == 0.5


# ----------------------------------------------------------------- data

def test_data_is_hashed_zipf_categoricals_with_labels_from_the_true_model():
    app = CTRApp.from_config(preset="tiny")
    s = app.spec
    block = app.generate_block(0)
    feats = block.data["features"].reshape(block.num_rows, s.num_fields + 1)
    assert np.all(feats[:, -1] == app.bias_index)
    assert feats[:, :-1].min() >= 0 and feats[:, :-1].max() < s.num_features
    # skewed value frequencies: a field's most common value is far above uniform's 1/values_per_field
    _, counts = np.unique(feats[:, 0], return_counts=True)
    assert counts.max() / block.num_rows > 20 / s.values_per_field
    # the same (field, value) hashes to the same bucket; fields hash differently
    a = ctr.hash_buckets(np.array([0, 0, 1]), np.array([5, 5, 5]), s.num_features)
    assert a[0] == a[1] and a[0] != a[2]
    # labels drawn from the true click probabilities: the click rate matches their mean
    p = ctr.sigmoid(app.true_weights[feats].sum(axis=1))
    assert abs(block.data["labels"].mean() - p.mean()) < 4 * np.sqrt(p.mean() * (1 - p.mean()) / block.num_rows)


def test_generation_is_deterministic_by_seed_and_block_and_heldout_is_separate():
    a, b, c = _app(), _app(), _app(seed=7)
    _assert_blocks_equal(a.generate_block(2), b.generate_block(2))
    assert not np.array_equal(a.generate_block(0).data["features"][:50], c.generate_block(0).data["features"][:50])
    held = a.generate_heldout()
    assert sum(h.num_rows for h in held) == a.num_heldout_rows
    assert not np.array_equal(held[0].data["features"][:50], a.generate_block(0).data["features"][:50])
    # a block alone (after other blocks, or in a fresh app with its caches dropped) is the same
    fresh = _app()
    fresh.generate_block(5)
    fresh.release_generation_caches()
    _assert_blocks_equal(fresh.generate_block(2), a.generate_block(2))
    with pytest.raises(AppConfigError, match="out of range"):
        a.generate_block(a.num_blocks)


# ----------------------------------------------------------------- the interface contract
# tests/unit/test_apps_interface.py's checks, applied to this app (they are parametrized over the
# registry's built-in names, so they are repeated here on a CTRApp).

def test_partition_i_of_n_equals_the_same_blocks_of_the_full_data():
    app = _app()
    full = app.generate_partition(0, 1).blocks
    assert len(full) == app.num_blocks >= 5
    parts = [app.generate_partition(i, 3) for i in range(3)]
    sizes = [len(p.blocks) for p in parts]
    assert sum(sizes) == len(full) and max(sizes) - min(sizes) <= 1
    for a, b in zip([b for p in parts for b in p.blocks], full):
        _assert_blocks_equal(a, b)
    assert [b.row_start for b in full] == [i * app.rows_per_block for i in range(len(full))]
    assert sum(b.num_rows for b in full) == app.num_rows
    assert not any(name in app.__dict__ for name in app.GENERATION_CACHES)   # dropped after generation


def test_model_layout_and_init_are_deterministic_per_key():
    app = _app()
    keys = app.model_keys()
    assert keys.dtype == np.int64 and len(keys) == app.num_keys
    full = app.init_value(keys)
    assert full.shape == (app.num_keys, app.key_length) and full.dtype == np.float32
    some = np.array([3, 1, app.num_keys - 1], dtype=np.int64)
    np.testing.assert_array_equal(app.init_value(some), full[some])
    assert app.model_nbytes() == full.nbytes
    assert app.data_nbytes() == sum(b.nbytes for b in app.generate_partition(0, 1).blocks)
    d = app.describe()
    assert d["app"] == "ctr" and d["num_keys"] == app.num_keys


def test_batch_keys_are_sorted_unique_and_cover_the_batch():
    app = _app()
    block = app.generate_block(0)
    assert app.init_block(block) is None and block.state == {}   # no worker-local state
    batches = list(app.batches(block))
    assert sum(b.size for b in batches) == block.num_rows
    keys = app.keys_for_batch(batches[0])
    assert keys.dtype == np.int64 and np.all(np.diff(keys) > 0)
    assert keys.min() >= 0 and keys.max() < app.num_keys
    ok = app.objective_keys(block)
    assert ok.dtype == np.int64 and np.all(np.diff(ok) > 0)
    params = KeyValues(keys, np.random.default_rng(0).normal(size=(len(keys), app.key_length)).astype(np.float32))
    before = params.values.copy()
    deltas = app.compute(batches[0], params, ctx=ctr.StepContext())
    np.testing.assert_array_equal(params.values, before)        # compute must not modify params
    np.testing.assert_array_equal(deltas.keys, keys)
    assert deltas.values.dtype == np.float32 and deltas.values.shape == params.values.shape
    # the rows' features are exactly what the keys cover
    r = app.hparams.features_per_key
    needed = np.unique(block.data["features"][: batches[0].size * (app.spec.num_fields + 1)] // r)
    np.testing.assert_array_equal(keys, needed)


def test_block_roundtrips_through_numpy_buffers():
    app = _app()
    block = app.generate_block(1)
    app.init_block(block)
    header, buffers = block.to_buffers()
    restored = DataBlock.from_buffers(header, [bytes(memoryview(b)) for b in buffers])
    _assert_blocks_equal(block, restored)
    assert restored.nbytes == block.nbytes


def test_objective_is_split_between_workers_and_servers():
    app = CTRApp.from_config(preset="tiny", hparams={"l2": 0.01})
    blocks = app.generate_partition(0, 1).blocks[:2]
    model = DenseModel(app)
    model.values[:] = np.random.default_rng(1).normal(0, 0.3, model.values.shape).astype(np.float32)
    model.values.reshape(-1)[app.num_weights:] = 0     # the last key's padding: no row touches it
    keys = app.model_keys()
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
    server_parts = [app.server_objective(model.pull(k)) for k in halves]
    w = app.weights_from_model(model.values).astype(np.float64)
    w_no_bias = w[: app.spec.num_features]
    assert sum(server_parts) == pytest.approx(0.5 * 0.01 * float(np.dot(w_no_bias, w_no_bias)), rel=1e-6)
    parts = [app.objective(b, model.pull(app.objective_keys(b))) for b in blocks]
    rows = sum(b.num_rows for b in blocks)
    logits = np.concatenate([w[b.data["features"].reshape(b.num_rows, -1)].sum(axis=1) for b in blocks])
    labels = np.concatenate([b.data["labels"] for b in blocks])
    expected = float(np.mean(np.logaddexp(0, logits) - labels * logits)) + sum(server_parts)
    assert app.combine(parts, server_parts) == pytest.approx(expected, rel=1e-6)
    assert sum(p.count for p in parts) == rows


def test_convergence_rule_uses_relative_change_and_epoch_limit():
    app = CTRApp.from_config(hparams={"convergence_threshold": 0.01, "max_epochs": 5})
    assert not app.maximize
    assert not app.is_converged([1.0])
    assert not app.is_converged([1.0, 0.9])
    assert app.is_converged([1.0, 0.995])
    assert not app.is_converged([1.0, float("nan")])
    assert app.is_converged([5.0, 4.0, 3.0, 2.0, 1.0])


@pytest.mark.parametrize("hparams,field", [
    ({"learning_rate": 0}, "learning_rate"),
    ({"batch_size": -1}, "batch_size"),
    ({"l2": -0.5}, "l2"),
    ({"features_per_key": "four"}, "features_per_key"),
    ({"momentum": 0.9}, "momentum"),
])
def test_bad_hyperparameters_are_refused_naming_the_field(hparams, field):
    with pytest.raises(AppConfigError, match=field):
        CTRApp.from_config(hparams=hparams)


def test_bad_spec_fields_and_presets_are_refused():
    with pytest.raises(AppConfigError, match="num_features"):
        CTRApp.from_config({"num_features": 1})
    with pytest.raises(AppConfigError, match="unknown field `bogus`"):
        CTRApp.from_config({"bogus": 1})
    with pytest.raises(AppConfigError, match="unknown preset 'huge'"):
        CTRApp.from_config(preset="huge")
    for preset in ("tiny", "small", "medium"):
        app = CTRApp.from_config(preset=preset)
        assert app.num_rows == ctr.PRESETS[preset].get("num_samples", app.num_rows)


# ----------------------------------------------------------------- as a job names it

def test_the_registry_loads_ctr_colon_class_from_the_working_dir(monkeypatch, tmp_path):
    # as an executor does: the NM links the shipped file into the container's working dir
    (tmp_path / "ctr.py").write_text(CTR_PATH.read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))     # the registry puts the working dir first
    monkeypatch.delitem(sys.modules, "ctr")
    app = create_app("ctr:CTRApp", {"num_samples": 500}, {"learning_rate": 1.0}, preset="tiny")
    assert type(app).__name__ == "CTRApp" and sys.modules["ctr"].__file__ == str(tmp_path / "ctr.py")
    assert app.num_rows == 500 and app.hparams.learning_rate == 1.0
    assert app.hparams.batch_size == ctr.PRESET_HPARAMS["tiny"]["batch_size"]   # the preset's, under the job's


# ----------------------------------------------------------------- on a cluster, as a user submits it

CLUSTER_AUC_TOLERANCE = 0.03
CLUSTER_LOG_LOSS_TOLERANCE = 0.035
CLUSTER_EPOCHS = 30


def elastane(cluster: Any, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", "--rm", cluster.rm_url, "--user", "alice",
                           *args], capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.cluster
def test_ctr_submitted_with_py_files_succeeds_near_the_true_auc_and_scales_out(cluster: Any, tmp_path: Path) -> None:
    # Enough epochs that the scale-out lands while it trains; the threshold never ends it early.
    r = elastane(cluster, "ps", "submit", "--app", "ctr:CTRApp", "--py-files", str(CTR_PATH), "--preset", "tiny",
                 "--workers", "2", "--servers", "1", "--max-epochs", str(CLUSTER_EPOCHS), "--set", "data.num_samples=100000",
                 "--hparam", "convergence_threshold=1e-9",
                 "--executor-memory", "256", "--am-memory", "320", "--staging-dir", str(tmp_path / "staging"),
                 "--name", "ctr-example")
    assert r.returncode == 0, r.stdout + r.stderr
    app_id = r.stdout.splitlines()[0].split()[-1]
    try:
        wait_until(lambda: (url := get_app(cluster.rm_url, app_id).get("trackingUrl"))
                   and (st := live_status(url)) is not None and len(st.objective_history) >= 2, 120,
                   "two epochs trained")
        s = elastane(cluster, "ps", "scale", app_id, "--workers", "+1", timeout_s=120)
        assert s.returncode == 0, s.stdout + s.stderr
        assert "add_workers" in s.stdout and "2/1" in s.stdout and "3/1" in s.stdout, s.stdout
        app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 300)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    except BaseException as e:
        e.add_note(app_post_mortem(cluster, app_id))
        raise
    finally:
        if get_app(cluster.rm_url, app_id)["state"] not in FINAL_STATES:   # never leave it training
            rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
    status = final_status(cluster, app_id)
    hist = status.objective_history
    assert [h.epoch for h in hist] == list(range(CLUSTER_EPOCHS))
    objs = [h.objective for h in hist]
    assert None not in objs, objs           # every epoch's objective finite
    # training went on through the change (the summed SGD steps of 2-3 workers are noisy early on:
    # an epoch may end up to ~1% above the one before, so the trend is checked, not each epoch)
    assert max(objs[-5:]) < min(objs[:3]), objs
    assert status.eps is not None
    [change] = status.eps.history
    assert change.op == "add_workers" and change.after is not None and change.after.workers == 3, change
    switched = change.epoch_switched
    assert switched is not None and switched < CLUSTER_EPOCHS - 2 and objs[-1] < objs[switched]
    m = status.final_metrics
    assert m is not None
    # stated: within 0.03 AUC and 0.035 log-loss of the true model's, on the held-out set
    assert m["auc"] >= m["true_model_auc"] - CLUSTER_AUC_TOLERANCE, m
    assert m["log_loss"] <= m["true_model_log_loss"] + CLUSTER_LOG_LOSS_TOLERANCE, m


def test_ctr_runs_under_cruise_with_its_input_spilled_unchanged(cluster: Any, tmp_path: Path) -> None:
    """The example needs nothing of its own for Cruise (the optimizer profiles it and decides on its
    cost model) or Harmony's spill (half of each worker's input blocks on disk as lz4 frames)."""
    r = elastane(cluster, "ps", "submit", "--app", "ctr:CTRApp", "--py-files", str(CTR_PATH), "--preset", "tiny",
                 "--workers", "2", "--servers", "1", "--max-epochs", "6", "--set", "data.num_samples=60000",
                 "--hparam", "convergence_threshold=1e-9", "--set", "optimizer=cruise", "--set", "spill_alpha=0.5",
                 "--executor-memory", "256", "--am-memory", "320", "--staging-dir", str(tmp_path / "staging"),
                 "--name", "ctr-cruise-spill")
    assert r.returncode == 0, r.stdout + r.stderr
    app_id = r.stdout.splitlines()[0].split()[-1]
    try:
        app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 300)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    except BaseException as e:
        e.add_note(app_post_mortem(cluster, app_id))
        raise
    finally:
        if get_app(cluster.rm_url, app_id)["state"] not in FINAL_STATES:
            rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
    status = final_status(cluster, app_id)
    assert status.cruise is not None and status.shape is not None
    decisions = status.cruise.decisions        # the optimizer's own JSON
    assert decisions and all(d["predicted_epoch_before_s"] > 0 for d in decisions), status.cruise
    workers = [e for e in status.shape.executors if e.role == "worker"]
    assert workers and all(e.spill_alpha == 0.5 and e.spilled_mb > 0 for e in workers), workers
    m = status.final_metrics
    assert m is not None
    assert m["auc"] >= m["true_model_auc"] - CLUSTER_AUC_TOLERANCE, m
