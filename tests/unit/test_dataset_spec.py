"""PS job specs with `data.path`: validated at submission by the same code path as the other data
fields, errors naming the field; without a path nothing changes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol import ps_job_spec
from protocol.dataset_manifest import MANIFEST_NAME
from protocol.ps_app_schemas import MLR_PRESETS
from psruntime.apps.dataset_files import write_generated
from psruntime.apps.registry import create_app


@pytest.fixture(scope="module")
def mlr_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("ds") / "mlr")
    write_generated(create_app("mlr", {"num_samples": 700, "num_features": 50, "num_classes": 3,
                                       "num_heldout": 60, "rows_per_block": 100}), out)
    return out


def error(spec: dict) -> ps_job_spec.JobSpecError:
    with pytest.raises(ps_job_spec.JobSpecError) as e:
        ps_job_spec.validate(spec)
    return e.value


def test_path_gives_the_dimensions(mlr_dir: str) -> None:
    spec = ps_job_spec.validate({"app": "mlr", "preset": "small", "data": {"path": mlr_dir}, "workers": 7})
    data = spec.app_data()
    assert (data["num_samples"], data["num_features"], data["num_classes"], data["rows_per_block"]) == (700, 50, 3, 100)
    assert data["path"] == mlr_dir
    # the same dimensions, given, are fine; the app built from app_data() reads the files
    spec = ps_job_spec.validate({"app": "mlr", "data": {"path": mlr_dir, "num_features": 50, "seed": 2}})
    app = create_app("mlr", spec.app_data(), spec.app_hparams())
    assert app.num_rows == 700 and app.seed == 2 and app.input_block(6).num_rows == 100


def test_a_preset_plays_no_part_beside_a_path(tmp_path: Path) -> None:
    # nmf's "small" preset sets the generator's rank: it must not reach the (re-checked) data spec
    out = str(tmp_path / "nmf")
    write_generated(create_app("nmf", {"num_users": 200, "rows_per_block": 50}), out)
    spec = ps_job_spec.validate({"app": "nmf", "preset": "small", "data": {"path": out}, "hparams": {"rank": 3}})
    data = spec.app_data()
    assert "rank" not in data and data["num_items"] == 200 and data["num_users"] == 200
    for preset in (None, "small"):     # what the AM and the executors do with it
        app = create_app("nmf", data, spec.app_hparams(), preset=preset)
        assert app.num_rows == 200 and app.input_block(3).num_rows == 50


def test_without_a_path_nothing_changes() -> None:
    spec = ps_job_spec.validate({"app": "mlr", "data": {"num_samples": 4000}})
    assert spec.app_data() == {**MLR_PRESETS["tiny"], "num_samples": 4000}


@pytest.mark.parametrize("data, field, message", [
    ({"path": "relative/dir"}, "data.path", "must be an absolute path"),
    ({"path": "/nonexistent/elastane-ds"}, "data.path", "is not a directory"),
    ({"path": 5}, "data.path", "Expected `str`"),
    ({"path": "{dir}", "num_classes": 4}, "data.num_classes", "4 contradicts the dataset's 3"),
    ({"path": "{dir}", "rows_per_block": 50}, "data.rows_per_block", "contradicts"),
    ({"path": "{dir}", "logit_scale": 2.0}, "data.logit_scale", "only used to generate synthetic data"),
    ({"path": "{dir}", "bogus": 1}, "data.bogus", "unknown field"),
])
def test_bad_data_paths_name_the_field(mlr_dir: str, data: dict, field: str, message: str) -> None:
    data = {k: (mlr_dir if v == "{dir}" else v) for k, v in data.items()}
    e = error({"app": "mlr", "data": data})
    assert e.field == field and message in e.detail, e


def test_app_mismatch_and_bad_manifests(mlr_dir: str, tmp_path: Path) -> None:
    e = error({"app": "lasso", "data": {"path": mlr_dir}})
    assert e.field == "data.path" and "holds mlr data" in e.detail
    empty = tmp_path / "empty"
    empty.mkdir()
    e = error({"app": "mlr", "data": {"path": str(empty)}})
    assert e.field == "data.path" and f"cannot read {empty}/{MANIFEST_NAME}" in e.detail
    (empty / MANIFEST_NAME).write_text(json.dumps({"format": "elastane-dataset"}))
    e = error({"app": "mlr", "data": {"path": str(empty)}})
    assert e.field == "data.path" and "not a valid dataset manifest" in e.detail
    # the file's blocks bound the workers, as the generator's do
    e = error({"app": "mlr", "data": {"path": mlr_dir}, "workers": 8})
    assert e.field == "workers" and "only 7 input blocks" in e.detail
