"""Model output end to end on the shared localhost cluster: a PS job with `output` leaves its final
model (and, with checkpoint_every_epochs, each checkpoint's) where `elastane.load_model` reads it
back and scores exactly the job's final held-out metrics; `elastane model show` prints it; a job
with `init_from` starts from it (its first objective near the saved one, far below a cold start's);
an init_from the AM cannot read fails the job naming it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import elastane
from appmaster.ps.submission import build_ps_submission
from conftest import get_app, submit_app, wait_app
from elastane_cli.main import main as cli
from protocol.ps_status import PsStatus
from ps_am_status import final_status

pytestmark = pytest.mark.cluster

SPEC = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 4, "convergence_threshold": 1e-9,
        "executor_memory_mb": 320}


def run(cluster: Any, spec: dict[str, Any], name: str, states: tuple[str, ...] = ("FINISHED",)
        ) -> tuple[dict[str, Any], PsStatus]:
    """Submit, wait for the end; (RM app report, the AM's final status file as the record it wrote)."""
    app_id = submit_app(cluster.rm_url, build_ps_submission(spec, name=name, am_memory=384))
    app = wait_app(cluster.rm_url, app_id, states, 240)
    final = final_status(cluster, app_id)
    return app, final


def objectives(final: PsStatus) -> list[float]:
    got = [e.objective for e in final.objective_history]
    assert None not in got, got         # every epoch's objective finite
    return [o for o in got if o is not None]


def final_metrics(final: PsStatus) -> dict[str, float]:
    assert final.final_metrics is not None and None not in final.final_metrics.values(), final.final_metrics
    return {k: v for k, v in final.final_metrics.items() if v is not None}


def test_output_loads_scores_like_the_job_and_warm_starts(cluster: Any, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model"
    app, final = run(cluster, {**SPEC, "output": str(out), "checkpoint_every_epochs": 2}, "model-out")
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    assert sorted(p.name for p in out.iterdir()) == ["epoch-2", "epoch-4", "final"]
    for d in ("epoch-2", "final"):
        assert sorted(p.name for p in (out / d).iterdir()) == ["metadata.json", "model.npz"]

    model = elastane.load_model(str(out))
    meta = model.metadata
    assert (meta.kind, meta.epoch, meta.app.name, meta.app.cls) == ("final", 4, "mlr", "psruntime.apps.mlr:MLRApp")
    assert meta.objective == pytest.approx(objectives(final)[-1])
    assert meta.heldout_metrics == pytest.approx(final_metrics(final))
    assert meta.job["output"] == str(out) and meta.elastane_version
    # the saved model scores exactly what the job scored at its end
    metrics = model.evaluate()
    assert metrics == pytest.approx(final_metrics(final))
    labels = [int(x) for b in model.app.generate_heldout() for x in b.data["labels"]]
    predicted = model.predict().argmax(axis=1)
    assert (predicted == labels).mean() == pytest.approx(final_metrics(final)["accuracy"])
    # the checkpoint of epoch 2 is an earlier, worse model
    early = elastane.load_model(str(out / "epoch-2"))
    assert (early.metadata.kind, early.metadata.epoch) == ("checkpoint", 2)
    assert early.metadata.objective == pytest.approx(objectives(final)[1])
    assert early.evaluate()["cross_entropy"] > metrics["cross_entropy"]

    assert cli(["model", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "mlr (psruntime.apps.mlr:MLRApp)" in shown and "after 4 epochs" in shown
    assert f"accuracy {final_metrics(final)['accuracy']:.6g}" in shown

    # warm start: the job continues from the saved model
    warm_app, warm = run(cluster, {**SPEC, "max_epochs": 2, "init_from": str(out)}, "model-warm")
    assert warm_app["finalStatus"] == "SUCCEEDED", warm_app["diagnostics"]
    cold_first, saved, warm_first = objectives(final)[0], objectives(final)[-1], objectives(warm)[0]
    assert warm.initial_objective == pytest.approx(saved, rel=0.02)
    assert warm_first < saved * 1.05 and warm_first < cold_first - 0.5 * (cold_first - saved), \
        (cold_first, saved, warm_first)


def test_init_from_the_am_cannot_read_fails_the_job_naming_it(cluster: Any, tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    app, final = run(cluster, {**SPEC, "init_from": str(missing)}, "model-missing", ("FINISHED", "FAILED"))
    assert app["finalStatus"] == "FAILED"
    assert f"init_from: no model at {missing}" in app["diagnostics"], app["diagnostics"]
    assert get_app(cluster.rm_url, app["id"])["finalStatus"] == "FAILED"
