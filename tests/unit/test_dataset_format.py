"""The dataset directory format: generated data written to files reads back array for array,
damaged or missing files fail naming the file, and training on the files follows the generator's
trajectory exactly (file data is the same bytes, so the same math)."""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from protocol.dataset_manifest import MANIFEST_NAME, DatasetError, load_manifest
from psruntime.apps.base import AppConfigError
from psruntime.apps.dataset_files import DatasetFileError, DatasetWriter, write_generated
from psruntime.apps.registry import APP_NAMES, create_app
from psruntime.apps.single_process import train_single_process

SMALL = {"mlr": {"num_samples": 600, "num_heldout": 130, "rows_per_block": 100},
         "lasso": {"num_samples": 600, "num_heldout": 130, "rows_per_block": 100},
         "nmf": {"num_users": 250, "num_heldout": 60, "rows_per_block": 50},
         "lda": {"num_docs": 250, "num_heldout": 60, "rows_per_block": 50}}


def written(tmp_path: Path, app: str, **extra) -> tuple[object, str]:
    gen = create_app(app, {**SMALL[app], **extra})
    out = str(tmp_path / f"{app}-ds")
    write_generated(gen, out)
    return gen, out


@pytest.mark.parametrize("app", APP_NAMES)
def test_generated_dataset_reads_back_array_for_array(tmp_path: Path, app: str) -> None:
    gen, out = written(tmp_path, app, seed=3)
    files = create_app(app, {"path": out, "seed": 3})
    assert files.num_rows == gen.num_rows and files.num_blocks == gen.num_blocks
    assert files.num_keys == gen.num_keys and files.data_nbytes() == gen.data_nbytes()
    for heldout, count in ((False, gen.num_blocks), (True, len(gen.generate_heldout()))):
        for b in range(count):
            want, got = gen.generate_block(b, heldout), files.input_block(b, heldout)
            assert (got.block_index, got.row_start, got.num_rows) == (want.block_index, want.row_start, want.num_rows)
            assert sorted(got.data) == sorted(want.data)
            for name, arr in want.data.items():
                assert got.data[name].dtype == arr.dtype and np.array_equal(got.data[name], arr), (b, name)
    # the manifest holds the dimensions and the generator's spec as provenance
    m = load_manifest(out)
    assert m.app == app and m.source["generator"]["spec"]["seed"] == 3
    # evaluation with file data names no ground-truth metric, and does not fail
    model = files.init_value(files.model_keys())
    truth_keys = set(gen.evaluate(model, gen.generate_heldout())) - set(files.evaluate(model, files.generate_heldout()))
    assert all(k in ("true_model_accuracy", "true_model_cross_entropy", "precision", "recall", "f1",
                     "chance_precision", "noise_std", "true_model_heldout_rmse",
                     "true_model_heldout_loglik_per_token") for k in truth_keys)
    assert truth_keys


def test_a_partition_reads_only_its_own_blocks(tmp_path: Path) -> None:
    gen, out = written(tmp_path, "mlr")
    app = create_app("mlr", {"path": out})
    for name in ("block-000000.npz", "block-000001.npz", "block-000002.npz"):   # partition 0 of 2
        os.unlink(os.path.join(out, "train", name))
    part = app.generate_partition(1, 2)
    assert [b.block_index for b in part.blocks] == [3, 4, 5]
    with pytest.raises(DatasetFileError, match=r"train/block-000000.npz: cannot read block file"):
        app.generate_partition(0, 2)


def _rewrite(out: str, rel: str, raw: bytes, fix_checksum: bool) -> None:
    Path(out, rel).write_bytes(raw)
    if fix_checksum:
        m = json.loads(Path(out, MANIFEST_NAME).read_text())
        for e in m["train"]:
            if e["file"] == rel:
                e["sha256"] = hashlib.sha256(raw).hexdigest()
        Path(out, MANIFEST_NAME).write_text(json.dumps(m))


def test_damaged_block_files_fail_naming_the_file(tmp_path: Path) -> None:
    _, out = written(tmp_path, "mlr")
    app = create_app("mlr", {"path": out})
    rel = "train/block-000001.npz"
    raw = Path(out, rel).read_bytes()
    _rewrite(out, rel, raw[:-10], fix_checksum=False)
    with pytest.raises(DatasetFileError, match=r"block-000001.npz: damaged block file \(sha256"):
        app.input_block(1)
    _rewrite(out, rel, b"not a zip", fix_checksum=True)
    with pytest.raises(DatasetFileError, match=r"block-000001.npz: not a readable .npz"):
        create_app("mlr", {"path": out}).input_block(1)
    with np.load(io.BytesIO(raw)) as npz:
        arrays = {k: npz[k] for k in npz.files}
    for change, message in ((dict(labels=arrays["labels"].astype(np.int64)), "array 'labels' is int64"),
                            (dict(labels=arrays["labels"] + 5), r"values outside \[0, 5\) \(num_classes\)"),
                            (dict(extra=arrays["labels"]), "holds arrays"),
                            (dict(indptr=arrays["indptr"][:-1]), "indptr must be 101")):
        buf = io.BytesIO()
        np.savez(buf, **{**arrays, **change})
        _rewrite(out, rel, buf.getvalue(), fix_checksum=True)
        with pytest.raises(DatasetFileError, match=message):
            create_app("mlr", {"path": out}).input_block(1)
    # a pickled object array is refused, never unpickled
    buf = io.BytesIO()
    np.savez(buf, **{**arrays, "labels": np.array([object()] * 100, dtype=object)})
    _rewrite(out, rel, buf.getvalue(), fix_checksum=True)
    with pytest.raises(DatasetFileError, match="not a readable .npz"):
        create_app("mlr", {"path": out}).input_block(1)


def test_manifest_errors_name_the_problem(tmp_path: Path) -> None:
    _, out = written(tmp_path, "nmf")
    good = json.loads(Path(out, MANIFEST_NAME).read_text())
    cases = [({**good, "format": "zip"}, "format is 'zip'"),
             ({**good, "version": 9}, "format version 9"),
             ({**good, "spec": {**good["spec"], "num_users": 260}}, "train lists blocks of"),
             ({**good, "spec": {k: v for k, v in good["spec"].items() if k != "num_items"}}, r"missing \['num_items'\]"),
             ({**good, "bogus": 1}, "unknown field"),
             ({**good, "train": [{**good["train"][0], "file": "../x.npz"}] + good["train"][1:]}, "inside the dataset")]
    for manifest, message in cases:
        Path(out, MANIFEST_NAME).write_text(json.dumps(manifest))
        with pytest.raises(DatasetError, match=message):
            load_manifest(out)
        with pytest.raises(AppConfigError, match=message):
            create_app("nmf", {"path": out})
    Path(out, MANIFEST_NAME).write_text("{not json")
    with pytest.raises(DatasetError, match="not a valid dataset manifest"):
        load_manifest(out)


def test_writer_refuses_an_existing_dataset_and_bad_blocks(tmp_path: Path) -> None:
    _, out = written(tmp_path, "lda")
    with pytest.raises(FileExistsError):
        DatasetWriter(out, "lda", 50)
    w = DatasetWriter(str(tmp_path / "new"), "lda", 2)
    with pytest.raises(ValueError, match="holds arrays"):
        w.add_block("train", {"indptr": np.array([0, 1], np.int64), "words": np.array([1], np.int32),
                              "z": np.array([0], np.int32)})
    with pytest.raises(ValueError, match="1..2 rows"):
        w.add_block("train", {"indptr": np.array([0, 1, 2, 3], np.int64), "words": np.array([1, 2, 3], np.int32)})


def test_training_on_files_follows_the_generators_trajectory(tmp_path: Path) -> None:
    gen, out = written(tmp_path, "mlr")
    hp = {"learning_rate": 0.5}
    res_gen, model_gen = train_single_process(create_app("mlr", SMALL["mlr"], hp), max_epochs=3)
    res_files, model_files = train_single_process(create_app("mlr", {"path": out}, hp), max_epochs=3)
    assert res_files.initial_objective == res_gen.initial_objective
    assert [e.objective for e in res_files.epochs] == [e.objective for e in res_gen.epochs]
    assert res_files.epochs[-1].objective < 0.9 * res_files.initial_objective
    assert np.array_equal(model_files.values, model_gen.values)
    assert res_files.metrics["accuracy"] == res_gen.metrics["accuracy"]
    assert "true_model_accuracy" in res_gen.metrics and "true_model_accuracy" not in res_files.metrics


def test_lda_training_on_files_matches_with_the_same_seed(tmp_path: Path) -> None:
    # seed also seeds LDA's initial topics and sampling, so it may be given beside a path
    gen, out = written(tmp_path, "lda", seed=5)
    res_gen, _ = train_single_process(create_app("lda", {**SMALL["lda"], "seed": 5}), max_epochs=2)
    res_files, _ = train_single_process(create_app("lda", {"path": out, "seed": 5}), max_epochs=2)
    assert [e.objective for e in res_files.epochs] == [e.objective for e in res_gen.epochs]
    assert set(res_files.metrics) == {"heldout_loglik_per_token"}
