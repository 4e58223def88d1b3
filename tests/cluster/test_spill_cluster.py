"""End to end on a localhost cluster (RM + 3 NMs, cgroup memory limits): a PS job whose worker's input
is larger than its container's memory is killed with -104 without spill, and finishes with
`spill_alpha: "auto"` -- the worker keeps most of its blocks on disk, and the job's report shows
its alpha and the megabytes spilled."""
from __future__ import annotations

from typing import Any

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import FINAL_STATES, get_app, pids_with_env, rest, submit_app, wait_app
from polling import wait_until
from protocol import container_env
from test_cluster_limits import cgroups_unusable_reason

pytestmark = pytest.mark.cluster

EXECUTOR_MB = 160
# ~165 MB of input on the one worker (412 bytes a sample): more than its 160 MB container holds
# beside the executor's own ~75 MB, in 40 blocks of ~4 MB so that most of it can sit on disk.
SPEC: dict[str, Any] = {"app": "mlr", "preset": "tiny", "workers": 1, "servers": 1, "max_epochs": 1,
                        "executor_memory_mb": EXECUTOR_MB, "heldout_every_epochs": 0,
                        "data": {"num_samples": 400_000, "rows_per_block": 10_000, "num_features": 1000,
                                 "nnz_per_sample": 50, "num_heldout": 500},
                        "hparams": {"batch_size": 2000}}


def _run(cluster: Any, spec: dict[str, Any], name: str) -> tuple[dict[str, Any], str]:
    app_id = submit_app(cluster.rm_url, build_ps_submission(spec, name=name, am_memory=384))
    try:
        app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 150)
    finally:
        if get_app(cluster.rm_url, app_id)["state"] not in FINAL_STATES:
            rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
    return app, app_id


def test_a_job_larger_than_its_containers_finishes_with_spill_and_is_killed_without(cluster: Any) -> None:
    reason = cgroups_unusable_reason()
    if reason:
        pytest.skip(reason)
    app, _ = _run(cluster, SPEC, "no-spill")
    assert app["finalStatus"] == "FAILED"
    assert "exited with -104 (KILLED_EXCEEDED_PMEM)" in app["diagnostics"], app["diagnostics"]

    app, app_id = _run(cluster, {**SPEC, "spill_alpha": "auto"}, "spill")
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    report = get_app(cluster.rm_url, app_id)["shape"]      # the AM's last job report
    assert report["alpha"] is not None and 0.5 <= report["alpha"] <= 1.0, report
    assert report["spilled_mb"] > 50, report
