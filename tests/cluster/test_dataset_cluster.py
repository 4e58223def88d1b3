"""End to end on a localhost cluster: MLR trains from a dataset directory written by
`elastane data generate` (data.path) to SUCCEEDED, with held-out accuracy reported."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import app_post_mortem, pids_with_env, submit_app, wait_app
from polling import wait_until
from ps_am_status import final_status
from elastane_cli.main import main as cli_main
from protocol import container_env

pytestmark = pytest.mark.cluster


def test_mlr_trains_from_files_written_by_data_generate(cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "mlr-ds"
    assert cli_main(["data", "generate", "--app", "mlr", "--set", "num_samples=1000", "--set", "rows_per_block=200",
                     "--out", str(out)]) == 0
    spec = {"app": "mlr", "data": {"path": str(out)}, "workers": 2, "servers": 1, "max_epochs": 4,
            "executor_memory_mb": 320}
    app_id = submit_app(cluster.rm_url, build_ps_submission(spec, name="ps-mlr-files", am_memory=384))
    try:
        app = wait_app(cluster.rm_url, app_id, ("FINISHED", "FAILED", "KILLED"), 180)
    finally:
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 60, "every process of the job gone")
    assert app["finalStatus"] == "SUCCEEDED", app_post_mortem(cluster, app_id)
    final = final_status(cluster, app_id)
    history = [final.initial_objective] + [h.objective for h in final.objective_history]
    assert history[-1] is not None and history[0] is not None and history[-1] < 0.9 * history[0], history
    m = final.final_metrics
    assert m is not None
    assert m["accuracy"] > 1.5 * m["chance_accuracy"], m
    assert "true_model_accuracy" not in m            # no ground truth with file data
    assert final.shape is not None
    workers = [e for e in final.shape.executors if e.role == "worker"]
    assert sorted(b for w in workers for b in w.blocks) == list(range(5)), workers
