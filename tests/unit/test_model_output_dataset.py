"""A model of a built-in app trained on a dataset directory (`data.path`) loads back: the AM's
writer records the data spec without the generator-only fields (which the app refuses beside a
path), and a model written before that -- its metadata carrying the spec's defaults of those
fields, e.g. mlr's logit_scale -- still loads. A user's generator field beside a path is still
refused at submission."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

import elastane
from appmaster.ps.model_output import ModelOutput
from elastane_cli.main import main as cli
from protocol import ps_job_spec
from protocol.dataset_manifest import recorded_data_spec
from protocol.model_output import MODEL_FILE, METADATA_FILE
from psruntime.apps.registry import create_job_app
from psruntime.apps.single_process import train_single_process
from psruntime.store.block_store import BlockArrays
from psruntime.store.checkpoint import write_block, write_manifest

SMALL = ("num_samples=600", "num_heldout=130", "rows_per_block=100")


def generated(tmp_path: Path) -> Path:
    """An mlr dataset directory as `elastane data generate` writes it."""
    out = tmp_path / "mlr-data"
    sets = [a for s in SMALL for a in ("--set", s)]
    assert cli(["data", "generate", "--app", "mlr", *sets, "--out", str(out)]) == 0
    return out


def train_and_write(tmp_path: Path, data: Path) -> tuple[Path, np.ndarray, dict[str, float]]:
    """Train the job's app on the dataset a few epochs, gather its model as servers' checkpoint
    blocks and write it as the AM does (ModelOutput.write); returns (output, values, held-out metrics)."""
    spec = ps_job_spec.validate({"app": "mlr", "data": {"path": str(data)}, "hparams": {"max_epochs": 3},
                                 "output": str(tmp_path / "model")})
    app = create_job_app(spec)
    result, model = train_single_process(app)
    values = np.asarray(model.values, np.float32).reshape(app.num_keys, app.key_length)
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    keys = app.model_keys()
    entries = {b: write_block(ckpt, b, BlockArrays(keys[b::spec.num_blocks], values[b::spec.num_blocks]))
               for b in range(spec.num_blocks)}
    write_manifest(ckpt, "executor_1", spec.num_blocks, 1, entries)
    out = ModelOutput(spec, app, "appattempt_1_0001_000001")
    history = [e.objective for e in result.epochs]
    meta = out.metadata("final", len(history), history, result.initial_objective, result.metrics, len(history), [])
    url = asyncio.run(out.write(str(ckpt), meta))
    assert url.endswith("final")
    return Path(spec.output or ""), values, result.metrics


def test_model_trained_on_a_dataset_directory_loads_and_evaluates(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    data = generated(tmp_path)
    output, values, metrics = train_and_write(tmp_path, data)
    recorded = json.loads((output / "final" / METADATA_FILE).read_text())["data"]
    assert recorded["path"] == str(data) and "logit_scale" not in recorded
    model = elastane.load_model(output)
    assert np.array_equal(model.values, values)
    scores = model.evaluate()
    assert scores["accuracy"] == pytest.approx(metrics["accuracy"])
    assert scores["accuracy"] > 0.3          # 5 classes: the trained model is well above chance
    assert model.predict().shape == (130, 5)
    assert model.evaluate(data) == pytest.approx(scores)
    assert cli(["model", "evaluate", str(output)]) == 0
    assert "accuracy\t" in capsys.readouterr().out


def test_model_written_with_the_generator_defaults_still_loads(tmp_path: Path) -> None:
    """Metadata as the AM wrote it before: every field of the app's spec, logit_scale included."""
    data = generated(tmp_path)
    output, values, metrics = train_and_write(tmp_path, data)
    meta_path = output / "final" / METADATA_FILE
    meta = json.loads(meta_path.read_text())
    app = create_job_app(ps_job_spec.validate({"app": "mlr", "data": {"path": str(data)}}))
    meta["data"] = msgspec.to_builtins(app.spec)
    assert meta["data"]["logit_scale"] == 4.0 and meta["data"]["path"] == str(data)
    meta_path.write_text(json.dumps(meta))
    assert (output / "final" / MODEL_FILE).is_file()
    model = elastane.load_model(output)
    assert model.evaluate()["accuracy"] == pytest.approx(metrics["accuracy"])
    assert np.array_equal(model.values, values)


def test_recorded_data_spec_drops_only_generator_fields_beside_a_path(tmp_path: Path) -> None:
    synthetic = {"num_samples": 10, "logit_scale": 2.0, "path": None, "seed": 3}
    assert recorded_data_spec("mlr", synthetic) == synthetic      # the generator needs them all
    with_path = {"path": "/d", "num_samples": 10, "noise_std": 0.1, "support_size": 4, "seed": 3}
    assert recorded_data_spec("lasso", with_path) == {"path": "/d", "num_samples": 10, "seed": 3}
    assert recorded_data_spec("mymod:App", {"path": "/d", "logit_scale": 1.0}) == {"path": "/d", "logit_scale": 1.0}


def test_a_generator_field_beside_a_path_is_still_refused_at_submission(tmp_path: Path) -> None:
    data = generated(tmp_path)
    with pytest.raises(ps_job_spec.JobSpecError, match="logit_scale: is only used to generate synthetic data"):
        ps_job_spec.validate({"app": "mlr", "data": {"path": str(data), "logit_scale": 4.0}})
