"""PS jobs end to end on a real localhost cluster (RM + 3 NMs as processes): each of the four apps
trains to convergence or its epoch limit with the objective improved by a stated factor; the
status endpoint (tracking URL) and the final status show the shape, objective history and memory
per executor; checkpoints are written; a killed executor fails the job naming it and its role."""
from __future__ import annotations

import json
import os
import re
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import (FINAL_STATES, am_control_headers, get_app, kill_unless_final, pids_with_env, rest,
                      running_cluster, submit_app, wait_app)
from polling import wait_until
from ps_am_status import running_status
from protocol import container_env
from protocol.ps_status import FINAL_STATUS_FILE, PsStatus, RecoveryStatus, read_status
from psruntime.store.checkpoint import load_blocks, load_manifests

pytestmark = pytest.mark.cluster

EXECUTOR_MB = 320


@pytest.fixture(scope="module")
def ps_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One RM + 3 NMs (1536 MB, 2 vcores each) shared by the PS tests of this module. A generous
    AM expiry: these tests are about training, not liveness, and an AM starting on a loaded
    machine missed the 5 s default (each of four tests failed so, with the suite's other worker busy)."""
    with running_cluster(tmp_path_factory.mktemp("ps-cluster"), node_memory_mb=1536, am_expiry_s=30) as c:
        yield c


def am_dir(cluster: Any, app_id: str) -> Path:
    return Path(cluster.base_dir) / "rm" / "apps" / app_id


def http_json(url: str, method: str = "GET", timeout_s: float = 30.0, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def run_job(cluster: Any, spec: dict[str, Any], name: str) -> tuple[dict[str, Any], PsStatus, PsStatus | None]:
    """Submit, watch the live status once training has started, wait for the end.
    Returns (RM app report, final status file, a live status seen while training or None)."""
    sub = build_ps_submission({"executor_memory_mb": EXECUTOR_MB, **spec}, name=name, am_memory=384)
    app_id = submit_app(cluster.rm_url, sub)
    seen: dict[str, PsStatus] = {}

    def training_or_done() -> bool:
        app = get_app(cluster.rm_url, app_id)
        s = running_status(app)
        if s is not None and s.objective_history and s.state == "TRAINING":   # not yet FINISHING
            seen.setdefault("live", s)
        return bool(seen) or app["state"] in FINAL_STATES

    wait_until(training_or_done, 120, f"{name} training")
    app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 180)
    final = read_status((am_dir(cluster, app_id) / FINAL_STATUS_FILE).read_bytes())
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
    return app, final, seen.get("live")


def check_common(app: dict[str, Any], final: PsStatus, live: PsStatus | None, spec: dict[str, Any],
                 cluster: Any) -> list[float]:
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    assert app["applicationType"] == "ELASTANE_PS"
    assert app["diagnostics"].startswith("final objective "), app["diagnostics"]
    assert final.state == "SUCCEEDED" and final.final_metrics
    shape = final.shape
    assert shape is not None and final.num_blocks is not None
    assert (shape.workers, shape.servers) == (spec["workers"], spec["servers"])
    roles = sorted(e.role for e in shape.executors)
    assert roles == ["server"] * spec["servers"] + ["worker"] * spec["workers"]
    for e in shape.executors:
        assert 20 < e.rss_mb < EXECUTOR_MB, e            # a real process, under its limit
        assert e.container_id.startswith("container_") and e.node
        if e.role == "worker":
            assert e.data_mb > 0 and e.blocks, e
        else:
            assert e.model_mb > 0 and e.blocks, e
    servers = [e for e in shape.executors if e.role == "server"]
    assert sorted(b for s in servers for b in s.blocks) == list(range(final.num_blocks))
    history = final.objective_history
    assert [h.epoch for h in history] == list(range(len(history))) and history
    assert all(h.epoch_time_s > 0 for h in history)
    assert final.epoch == len(history)
    assert f"after {len(history)} epochs" in app["diagnostics"]
    workers = final.metrics.workers
    assert sorted(workers) == [f"worker-{i}" for i in range(spec["workers"])]
    assert all((w.compute_s or 0) > 0 and (w.comm_s or 0) > 0 and w.batches > 0 for w in workers.values())
    assert all((s.service_s or 0) > 0 and s.requests > 0 for s in final.metrics.servers.values())
    # the final checkpoint holds every block of the model
    ckpt = final.checkpoints[-1]
    assert ckpt.epoch == len(history) and Path(ckpt.dir).is_dir()
    assert sorted(load_manifests(ckpt.dir, final.num_blocks)) == list(range(final.num_blocks))
    if live is not None:        # the tracking URL served the same kind of status while training
        assert live.state == "TRAINING" and live.shape is not None and live.shape.servers == spec["servers"]
        assert all(e.rss_mb > 0 for e in live.shape.executors)
    objectives = [final.initial_objective] + [h.objective for h in history]
    assert None not in objectives, objectives        # every objective finite
    return [o for o in objectives if o is not None]


def final_metrics(final: PsStatus) -> dict[str, float]:
    """The final model's held-out metrics, every one finite."""
    assert final.final_metrics is not None and None not in final.final_metrics.values(), final.final_metrics
    return {k: v for k, v in final.final_metrics.items() if v is not None}


def test_mlr_trains_and_improves(ps_cluster) -> None:
    spec = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 8, "checkpoint_every_epochs": 4}
    app, final, live = run_job(ps_cluster, spec, "ps-mlr")
    obj = check_common(app, final, live, spec, ps_cluster)
    assert obj[-1] < 0.6 * obj[0], obj                     # cross-entropy from log(5) down
    # the one at setup is what a recovery from a lost executor goes back to (appmaster.ps.recovery)
    assert [c.epoch for c in final.checkpoints] == [0, 4, 8]
    assert final.recovery == RecoveryStatus(enabled=True, max_executor_failures=3, failures=0, losses=[],
                                            recoveries=0, replacements=0)
    m = final_metrics(final)
    assert m["accuracy"] > 2.5 * m["chance_accuracy"], m
    # held-out quality every 2 epochs (the default) beside the training objective, and at the end
    # the stop criterion and the final model against the true model
    heldout = final.heldout
    assert heldout.metric == "cross_entropy" and [p.epoch for p in heldout.history] == [1, 3, 5, 7]
    assert heldout.history[-1].metrics == m and heldout.true_model_value == m["true_model_cross_entropy"]
    assert final.stop_criterion == "epoch limit" and "(epoch limit; " in app["diagnostics"]
    assert "vs true model" in app["diagnostics"]


def test_mlr_early_stopping_ends_the_job_on_heldout_quality(ps_cluster) -> None:
    # Few rows for many weights and no L2: the held-out cross-entropy bottoms out after ~7 epochs
    # while the training objective keeps falling (1% worse 4 epochs later).
    spec = {"app": "mlr", "workers": 2, "servers": 1, "max_epochs": 25, "convergence_threshold": 1e-9,
            "data": {"num_samples": 500, "rows_per_block": 125, "num_features": 400, "nnz_per_sample": 20},
            "hparams": {"l2": 0, "learning_rate": 3.0, "lr_decay": 0}, "early_stopping": 5,
            "heldout_every_epochs": 1}
    app, final, live = run_job(ps_cluster, spec, "ps-mlr-early-stop")
    obj = check_common(app, final, live, spec, ps_cluster)
    epochs = len(obj) - 1
    assert epochs < 25 and final.converged, obj
    assert (final.stop_criterion or "").startswith(
        "early stopping: held-out cross_entropy did not improve for 5 epochs")
    assert "(early stopping: " in app["diagnostics"]
    heldout = final.heldout
    best, last = heldout.best, heldout.history[-1]
    assert best is not None and best.value is not None and best.objective is not None, heldout
    assert last.epoch - best.epoch >= 5 and all(p.value is not None and p.value >= best.value for p in heldout.history)
    assert epochs <= last.epoch + 3         # stopped within a couple of epochs of the deciding score
    assert last.objective is not None and last.objective < best.objective   # training kept improving after the best held-out epoch ...
    assert heldout.warning and "overfits" in heldout.warning, heldout     # ... and the job said so


def test_nmf_trains_and_improves(ps_cluster) -> None:
    spec = {"app": "nmf", "workers": 2, "servers": 1, "max_epochs": 12}
    app, final, live = run_job(ps_cluster, spec, "ps-nmf")
    obj = check_common(app, final, live, spec, ps_cluster)
    assert obj[-1] < 0.2 * obj[0], obj
    m = final_metrics(final)
    assert m["heldout_rmse"] < 0.7 * m["mean_predictor_rmse"], m


def test_lda_converges(ps_cluster) -> None:
    spec = {"app": "lda", "workers": 2, "servers": 2}
    app, final, live = run_job(ps_cluster, spec, "ps-lda")
    obj = check_common(app, final, live, spec, ps_cluster)
    assert obj[-1] > 0.7 * obj[0], obj                     # log-likelihood per token: up (less negative)
    assert final.converged and len(obj) - 1 < 30        # converged before its epoch limit
    assert "converged" in app["diagnostics"]


def test_lasso_converges_with_ssp(ps_cluster) -> None:
    spec = {"app": "lasso", "workers": 2, "servers": 1, "sync": "ssp", "staleness": 1}
    app, final, live = run_job(ps_cluster, spec, "ps-lasso")
    obj = check_common(app, final, live, spec, ps_cluster)
    assert obj[-1] < 0.5 * obj[0], obj
    assert final_metrics(final)["f1"] > 0.8, final.final_metrics


def test_checkpoint_on_request_then_killed_worker_fails_the_job(ps_cluster) -> None:
    # Effectively endless training, so the job is surely running when we act on it; a job that
    # survives no executor loss (max_executor_failures 0) fails naming it.
    spec = {"app": "nmf", "workers": 2, "servers": 1, "max_epochs": 10_000, "convergence_threshold": 1e-12,
            "executor_memory_mb": EXECUTOR_MB, "max_executor_failures": 0}
    app_id = submit_app(ps_cluster.rm_url, build_ps_submission(spec, name="ps-kill", am_memory=384))
    try:
        status: PsStatus = wait_until(lambda: (s := running_status(get_app(ps_cluster.rm_url, app_id)))
                                      and len(s.objective_history) >= 2 and s, 120, "two epochs trained")
        # the live status at the tracking URL: shape, memory next to data per executor, history
        assert status.shape is not None and status.num_blocks is not None and status.initial_objective is not None
        assert status.state == "TRAINING" and (status.shape.workers, status.shape.servers) == (2, 1)
        for e in status.shape.executors:
            assert e.state == "READY" and 20 < e.rss_mb < EXECUTOR_MB and (e.pid or 0) > 0, e
            assert (e.data_mb > 0) if e.role == "worker" else (e.model_mb > 0), e
        assert all(h.objective is not None and h.objective < status.initial_objective for h in status.objective_history)
        url = get_app(ps_cluster.rm_url, app_id)["trackingUrl"].rstrip("/")
        ckpt = http_json(url + "/checkpoint", "POST", headers=am_control_headers(ps_cluster, url))
        assert ckpt["epoch"] >= 2 and Path(ckpt["dir"]).parent == am_dir(ps_cluster, app_id) / "checkpoints"
        blocks = load_blocks(ckpt["dir"], status.num_blocks)
        assert sum(len(b.keys) for b in blocks.values()) == 200
        assert all(b.values is not None and b.values.shape == (len(b.keys), 5) for b in blocks.values())
        victim = next(e for e in status.shape.executors if e.id == "worker-1")
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        app = wait_app(ps_cluster.rm_url, app_id, ("FINISHED", "FAILED"), 60)
    finally:
        kill_unless_final(ps_cluster.rm_url, app_id)   # never leave it training
    assert app["finalStatus"] == "FAILED", app
    diag = app["diagnostics"]
    assert "worker-1 (worker, " in diag and victim.container_id in diag and "exited with" in diag, diag
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")


def test_executor_over_its_memory_limit_fails_the_job_with_the_reason(ps_cluster) -> None:
    # Each worker would generate ~160 MB of input: over a 64 MB limit (-104) by its own allocations
    # alone (an executor forked warm from the NM's zygote shares the interpreter's and the apps'
    # preloaded pages with it; those stay charged to the NM, as a shared library's would). It is
    # killed once past the limit, so the size costs no time.
    spec = {"app": "mlr", "workers": 2, "servers": 1, "executor_memory_mb": 64,
            "data": {"num_samples": 2_000_000, "rows_per_block": 20_000}}
    app_id = submit_app(ps_cluster.rm_url, build_ps_submission(spec, name="ps-oom", am_memory=384))
    app = wait_app(ps_cluster.rm_url, app_id, ("FINISHED", "FAILED"), 120)
    assert app["finalStatus"] == "FAILED", app
    diag = app["diagnostics"]
    assert re.search(r"worker-\d \(worker, container_\w+ on [^)]+\) exited with -104", diag), diag
    assert "exited with -104 (KILLED_EXCEEDED_PMEM): over its 64 MB limit" in diag, diag
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")


def test_killing_the_app_stops_the_am_and_every_executor(ps_cluster) -> None:
    spec = {"app": "lda", "workers": 2, "servers": 1, "max_epochs": 10_000, "convergence_threshold": 1e-12}
    app_id = submit_app(ps_cluster.rm_url, build_ps_submission(spec, name="ps-killed", am_memory=384))
    wait_until(lambda: (s := running_status(get_app(ps_cluster.rm_url, app_id))) and s.objective_history, 120,
               "training")
    assert len(pids_with_env(container_env.APP_ID, app_id)) >= 4        # the AM and three executors
    rest(ps_cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
    app = wait_app(ps_cluster.rm_url, app_id, ("KILLED",), 60)
    assert app["finalStatus"] == "KILLED"
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
