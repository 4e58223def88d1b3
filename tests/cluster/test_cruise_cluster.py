"""Cruise on a real localhost cluster (RM + 3 NMs, emulated per-executor bandwidth caps).

An MLR job whose mini-batches exchange most of its model starts at a deliberately bad split,
4 workers / 1 server: the one server's link carries every worker's pulls. With optimizer "cruise"
the AM measures the first epoch, solves, and reconfigures while training -- switching workers to
servers in place and moving input splits and model blocks. Checked: a plan with switches and
moves ran without error, the shape changed to one with more servers (the model predicted a shorter
epoch; the measured epochs before and after are recorded -- the speed-up itself is a benchmark's,
bench/cruise_reconfig.py), the objective trajectory continues (no jump back towards the
untrained objective), every mini-batch update reached the servers exactly once (the servers'
audit counter equals the mini-batches the workers report), and the job's processes are gone.
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import pids_with_env, running_cluster, submit_app, wait_app
from polling import wait_until
from ps_am_status import final_status
from protocol import container_env

pytestmark = pytest.mark.cluster

# 20,000 features in keys of 4: 5,000 keys of 5 classes (400 KB of model); 200 non-zeros per row
# and 50 rows per mini-batch touch nearly every key, so communication dominates at 20 mbit/s
# (and is paced, so CPU load from other processes on the machine moves it little).
CRUISE_JOB: dict[str, Any] = {
    "app": "mlr", "data": {"num_features": 20_000, "nnz_per_sample": 200, "num_samples": 1000,
                           "rows_per_block": 125},
    "hparams": {"learning_rate": 0.5}, "workers": 4, "servers": 1, "blocks": 12, "max_epochs": 8,
    "optimizer": "cruise", "cruise": {"min_batches": 4}, "audit_updates": True, "executor_memory_mb": 320,
}


@pytest.fixture(scope="module")
def capped_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("cruise-cluster"), node_memory_mb=2048, node_vcores=4,
                         nm_expiry_s=5, am_expiry_s=10, node_bandwidth="20mbit", network="emulated") as c:
        yield c


def test_bad_split_is_reconfigured_during_training(capped_cluster: Any) -> None:
    app_id = submit_app(capped_cluster.rm_url, build_ps_submission(CRUISE_JOB, name="cruise-bad-split",
                                                                   am_memory=384))
    app = wait_app(capped_cluster.rm_url, app_id, ("FINISHED", "FAILED", "KILLED"), 300)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
    st = final_status(capped_cluster, app_id)
    cruise = st.cruise
    assert st.optimizer == "cruise" and cruise is not None
    plans = cruise.plan_history
    assert plans, cruise.decisions
    first = plans[0]
    assert first.error == "" and first.run is not None and first.run.ok, first
    assert first.shape_before == [4, 1] and first.shape_after is not None
    w, s = first.shape_after
    assert w + s == 5 and s > 1, first
    assert all(p.error == "" for p in plans), plans
    ops = first.run.plan.get("ops")            # the plan as appmaster.cruise writes it
    kinds = [op["op"] for op in ops if isinstance(op, dict)] if isinstance(ops, list) else []
    assert "switch" in kinds and "move" in kinds, kinds
    before, after = first.predicted_epoch_before_s, first.predicted_epoch_after_s
    assert before is not None and after is not None and after < before, first
    assert first.bytes_moved > 0

    # The epoch time after the plan is measured and recorded. Whether it dropped is a wall-clock
    # figure that a loaded CI host can invert: bench/cruise_reconfig.py measures it, not this test.
    last = plans[-1]
    assert last.error == "" and last.measured_epoch_after_s is not None, plans
    assert last.measured_epoch_after_s > 0 and (first.measured_epoch_before_s or 0) > 0, plans
    assert cruise.shape == last.shape_after

    # The model came through intact: the objective goes on from where it was, no update lost or doubled.
    history = st.objective_history
    assert [h.epoch for h in history] == list(range(len(history)))
    obj = [st.initial_objective] + [h.objective for h in history]
    assert None not in obj, obj          # every objective finite
    at = first.epoch
    assert all(o < 1.02 * obj[at] for o in obj[at + 1:]), (at, obj)
    assert obj[-1] < 0.8 * obj[0], obj
    batches = sum(wk.batches for wk in st.metrics.workers.values())
    assert st.eps is not None and st.eps.minibatches_applied == batches > 0

    # The executors now serve their new roles; every input split and model block has one owner.
    assert st.shape is not None
    executors = [e for e in st.shape.executors if e.state != "EXITED"] or st.shape.executors
    assert sum(1 for e in executors if e.role == "server") >= s
