"""An SSP job's shape directive on a real localhost cluster (RM + 2 NMs as processes): EPS's live
change keeps BSP clock boundaries only, so the AM carries an SSP job's directive out by the
kill-based restart (checkpoint, new executors, restore) -- before, it acted on it as no change,
and the job never took the shape its policy gave it. Checked: the restart is in the job's shape
history with the directive's shape, the objective restored is the checkpoint's, the job trains
on at its new shape with every epoch counted once, and nothing of it is left after the kill."""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import am_status, kill_unless_final, pids_with_env, rest, restarted_and_trained_on, running_cluster, submit_app, wait_app
from polling import wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("ssp-cluster"), nodes=2, node_memory_mb=1536, node_vcores=3,
                         nm_expiry_s=5, am_expiry_s=10) as c:
        yield c


def test_an_ssp_job_takes_its_directives_shape_through_a_restart(cluster: Any) -> None:
    spec = {"app": "mlr", "workers": 1, "servers": 1, "max_workers": 2, "sync": "ssp", "staleness": 1,
            "max_epochs": 100_000, "convergence_threshold": 1e-12, "executor_memory_mb": 320}
    app_id = submit_app(cluster.rm_url, build_ps_submission(spec, name="ssp-directed", am_memory=384))
    seen: dict[str, Any] = {}
    try:
        wait_until(lambda: (st := am_status(cluster, app_id)) is not None and len(st.objective_history) >= 1,
                   120, "the SSP job training")
        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/shape", {"workers": 2, "servers": 1},
             user="alice")

        seen["status"] = wait_until(lambda: restarted_and_trained_on(cluster, app_id), 180,
                                    "the SSP job restarted at 2 workers and trained on")
    finally:
        kill_unless_final(cluster.rm_url, app_id)
    wait_app(cluster.rm_url, app_id, ("FINISHED", "FAILED", "KILLED"), 60)
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")

    st = seen["status"]
    restart = st.shape_history[0]
    assert (restart.workers, restart.servers) == (2, 1) and restart.error == "", restart
    assert restart.objective_restored == pytest.approx(restart.objective_before, rel=1e-4)
    assert [d.version for d in st.directives] == [1] and st.directives[0].error == ""
    assert [h.epoch for h in st.objective_history] == list(range(len(st.objective_history)))
