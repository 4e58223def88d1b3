"""The model output format without a cluster: the RM's model shapes agree with the apps', a
written model reads back (values, metadata, predict / evaluate as the app computes them),
`elastane model` prints it, and init_from is refused naming a mismatch at validation."""
from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

import elastane
from appmaster.ps.model_output import ModelOutput, read_init_from
from elastane_cli.main import main as cli
from protocol import ps_job_spec
from protocol.durable_storage import DurableDir
from protocol.model_output import METADATA_FILE, ModelOutputError, builtin_model_shape, locate, read_metadata
from psruntime.apps.base import KeyValues
from psruntime.apps.registry import create_app
from psruntime.store.block_store import BlockArrays
from psruntime.store.model_files import model_from_blocks, write_model

APPS = ("mlr", "lasso", "nmf", "lda")


def save(root: Path, app_name: str, spec_json: dict | None = None, kind: str = "final") -> tuple[np.ndarray, object]:
    """A model of the app (random values) written as a job's output under `root`."""
    spec = ps_job_spec.validate({"app": app_name, **(spec_json or {})})
    app = create_app(app_name, spec.app_data(), spec.app_hparams())
    meta = ModelOutput(spec, app, "appattempt_1_0001_000001").metadata(
        kind, 3, [3.0, 2.0, 1.5], 4.0, {"accuracy": 0.5}, 3, [])
    values = np.random.default_rng(1).random((app.num_keys, app.key_length)).astype(np.float32)
    write_model(DurableDir(str(root)).child("final" if kind == "final" else "epoch-3"), values, meta)
    return values, app


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_model_written_again_is_incomplete_until_its_new_metadata_is_written(tmp_path: Path, where: str,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A rerun writes the same output again and fails before its metadata.json: the directory is
    incomplete (no model there) -- not the new values under the old run's metadata, which agree in
    shape, so nothing would tell."""
    root = tmp_path / "model" if where == "local" else f"memory://rewrite-{where}-{id(tmp_path)}"
    save(root, "mlr")                                 # type: ignore[arg-type]
    assert read_metadata(locate(str(root))).attempt_id == "appattempt_1_0001_000001"
    real = DurableDir.write_bytes

    def metadata_fails(self: DurableDir, name: str, data: bytes) -> None:
        if name == METADATA_FILE:
            raise OSError("the store went away")
        real(self, name, data)
    monkeypatch.setattr(DurableDir, "write_bytes", metadata_fails)
    with pytest.raises(OSError, match="went away"):
        save(root, "mlr")                             # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="no model"):
        locate(str(root))


@pytest.mark.parametrize("app_name", APPS)
@pytest.mark.parametrize("preset", ["tiny", "medium"])
def test_builtin_model_shape_is_the_apps(app_name: str, preset: str) -> None:
    app = create_app(app_name, None, None, preset=preset)
    shape = builtin_model_shape(app_name, msgspec.to_builtins(app.spec), msgspec.to_builtins(app.hparams))
    assert shape == (app.num_keys, app.key_length)


@pytest.mark.parametrize("app_name", APPS)
def test_saved_model_loads_and_predicts_like_the_app(tmp_path: Path, app_name: str) -> None:
    values, app = save(tmp_path, app_name)
    model = elastane.load_model(str(tmp_path))
    assert np.array_equal(model.values, values) and model.values.dtype == np.float32
    assert model.metadata.app.name == app_name and model.metadata.epoch == 3
    assert model.metadata.objective == 1.5 and model.metadata.heldout_metrics == {"accuracy": 0.5}
    heldout = app.generate_heldout()
    assert model.evaluate() == pytest.approx(app.evaluate(values, heldout))
    pred = model.predict()
    params = KeyValues(app.model_keys(), values)
    assert np.allclose(pred, np.concatenate([app.predict(b, params) for b in heldout]))
    rows = sum(b.num_rows for b in heldout)
    entries = sum(int(b.data["indptr"][-1]) for b in heldout)
    assert len(pred) == (entries if app_name == "nmf" else rows)


def test_mlr_predictions_are_probabilities_whose_argmax_scores_the_accuracy(tmp_path: Path) -> None:
    save(tmp_path, "mlr")
    model = elastane.load_model(tmp_path / "final")         # a model directory works as well
    probs = model.predict()
    assert np.allclose(probs.sum(axis=1), 1.0)
    labels = np.concatenate([b.data["labels"] for b in model.app.generate_heldout()])
    assert (probs.argmax(axis=1) == labels).mean() == pytest.approx(model.evaluate()["accuracy"])


def test_model_from_blocks_assembles_every_key_and_names_missing_ones() -> None:
    blocks = {0: BlockArrays(np.array([0, 2]), np.array([[1.0], [3.0]], np.float32), ["eps:minibatches"],
                             [np.array([7.0])]),
              1: BlockArrays(np.array([1]), np.array([[2.0]], np.float32))}
    assert model_from_blocks(blocks, 3, 1).ravel().tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ModelOutputError, match="lacks 1 of 4 model keys"):
        model_from_blocks(blocks, 4, 1)


def test_cli_model_show_evaluate_predict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(tmp_path, "lasso")
    assert cli(["model", "show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "app:        lasso (psruntime.apps.lasso:LassoApp)" in out and "after 3 epochs" in out
    assert "accuracy 0.5" in out and "features_per_key" in out
    assert cli(["model", "show", "--json", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["app"]["class"] == "psruntime.apps.lasso:LassoApp"
    assert cli(["model", "evaluate", str(tmp_path)]) == 0
    assert "heldout_rmse\t" in capsys.readouterr().out
    assert cli(["model", "predict", str(tmp_path), "--out", str(tmp_path / "p.npy")]) == 0
    assert np.load(tmp_path / "p.npy").shape == (500,)


def test_cli_model_errors_name_the_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["model", "show", str(tmp_path / "none")]) == 2
    assert "OUTPUT: cannot read the model" in capsys.readouterr().err
    save(tmp_path, "mlr")
    assert cli(["model", "evaluate", str(tmp_path), "--data", str(tmp_path / "nodata")]) == 2
    assert "--data:" in capsys.readouterr().err


def test_data_path_of_another_shape_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(tmp_path / "model", "mlr")
    assert cli(["data", "generate", "--app", "mlr", "--set", "num_features=40", "--out", str(tmp_path / "d")]) == 0
    with pytest.raises(ModelOutputError, match="20 x 20 .* 10 x 20"):
        elastane.load_model(tmp_path / "model").evaluate(tmp_path / "d")


def test_data_path_of_the_same_shape_is_scored(tmp_path: Path) -> None:
    save(tmp_path / "model", "mlr")
    assert cli(["data", "generate", "--app", "mlr", "--out", str(tmp_path / "d")]) == 0
    model = elastane.load_model(tmp_path / "model")
    # The same generated rows as files: the same scores, less the ground truth's
    on_files = model.evaluate(tmp_path / "d")
    assert on_files["accuracy"] == pytest.approx(model.evaluate()["accuracy"])
    assert "true_model_accuracy" not in on_files


def test_init_from_is_refused_naming_the_mismatch(tmp_path: Path) -> None:
    save(tmp_path / "m", "mlr")
    ok = ps_job_spec.validate({"app": "mlr", "init_from": str(tmp_path / "m")})
    assert ok.init_from == str(tmp_path / "m")
    with pytest.raises(ps_job_spec.JobSpecError, match=r"^init_from: .* is of app 'mlr', this job's app is 'lasso'"):
        ps_job_spec.validate({"app": "lasso", "init_from": str(tmp_path / "m")})
    with pytest.raises(ps_job_spec.JobSpecError, match=r"^init_from: .*num_keys 20 x key_length 20, this job's "
                                                       r"model is 20 x 40"):
        ps_job_spec.validate({"app": "mlr", "init_from": str(tmp_path / "m"), "data": {"num_classes": 10}})
    with pytest.raises(ps_job_spec.JobSpecError, match="^init_from: lda cannot start from a saved model"):
        ps_job_spec.validate({"app": "lda", "init_from": str(tmp_path / "m")})
    with pytest.raises(ps_job_spec.JobSpecError, match="^output: 'rel' is not an absolute path"):
        ps_job_spec.validate({"app": "mlr", "output": "rel"})
    # Unreadable here (the RM's host): left to the AM, which refuses it naming init_from
    ps_job_spec.validate({"app": "mlr", "init_from": str(tmp_path / "elsewhere")})
    app = create_app("mlr", {"num_classes": 10}, None, preset="tiny")
    with pytest.raises(ModelOutputError, match="^init_from: .*num_keys 20 x key_length 20"):
        read_init_from(str(tmp_path / "m"), app)
    with pytest.raises(ModelOutputError, match="^init_from: no model at"):
        read_init_from(str(tmp_path / "elsewhere"), app)
