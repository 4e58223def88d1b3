"""The PS AM's status records (protocol.ps_status) from producer to consumer: each record is made
by the AM's own code (cruise_driver, metrics, heldout_monitor, the master's suspension section) or is
the protocol.ps_status record the AM keeps (a directive acted on),
serialised as `/status` serves it (protocol.codec, Structs inside a dict) and decoded once by the
CLI (`decode_status`) for `ps scale`, `ps status`, the progress bar and `ps submit --wait`'s final
report. A field the CLI reads that the AM does not write fails here, not on a cluster."""
from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import Any

import msgspec

from appmaster.cruise.optimizer import Decision
from appmaster.cruise.plan import AddOp, Plan
from appmaster.cruise.targets import Role
from appmaster.ps.cruise_driver import OpTiming, PlanRecord, PlanRun
from appmaster.container_book import AmContainer
from appmaster.ps.eps_records import ElasticOpRecord
from appmaster.ps.runtime.executor_pool import ExecutorPool, Role as ExecutorRole
from appmaster.ps.executor_status import spill_status
from appmaster.ps.heldout_monitor import HeldoutPoint, HeldoutTracker
from appmaster.ps.metrics import EpochRecord, JobMetrics
from appmaster.ps.controller import Phase
from appmaster.ps.runtime.master import PSApplicationMaster
from elastane_cli import ps_reports, ps_scale_command
from elastane_cli.progress_bar import format_progress
from elastane_cli.ps_commands import WatchResult
from protocol import codec, ps_job_spec
from protocol import executor_ops as ops
from protocol.model_output import METADATA_FILE, AppRef, ModelMetadata, encode_metadata, read_metadata
from protocol.durable_storage import DurableDir
from protocol.records import Resource
from protocol.ps_status import CruiseStatus, DirectiveRecord, PsStatus, SuspensionCut, decode_status
from protocol.shape_history import EpsChange, ExecutorCounts, history_json
from psruntime.apps.quality import heldout_metric
from psruntime.wire.frame_codec import Frame


def served(status: dict[str, Any]) -> PsStatus:
    """`status` as the CLI gets it: encoded the way the AM's /status does, decoded by the CLI."""
    return decode_status(json.loads(codec.dumps(status)))


def _directive(version: int, workers: int, before: int, steps: list[tuple[str, int]], started: float,
               **kw: Any) -> DirectiveRecord:
    return DirectiveRecord(version=version, workers=workers, servers=1, before=ExecutorCounts(before, 1),
                           steps=steps, started=started, **kw)


def test_ps_scale_reads_the_directive_outcomes_the_am_records() -> None:
    running = _directive(3, 4, 2, [("add_workers", 2)], 1_700_000_000.0, reason="ps scale")
    status = served({"directives": [running]})
    d = status.directives[0]
    assert (d.version, d.workers, d.servers, d.before.workers, d.steps) == (3, 4, 1, 2, [("add_workers", 2)])
    assert ps_scale_command._outcome(status, 3) is None                   # its change still runs
    running.seconds = round(1.23456, 4)                # as the AM records it (master: 4 places)
    done = ps_scale_command._outcome(served({"directives": [running]}), 3)
    assert done is not None and done.seconds == 1.2346 and done.error == "" and done.reason == "ps scale"
    failed = _directive(4, 9, 2, [("add_workers", 7)], 1.0, error="no room")
    outcome = ps_scale_command._outcome(served({"directives": [running, failed]}), 4)
    assert outcome is not None and outcome.error == "no room"
    assert ps_scale_command._outcome(served({"directives": [running]}), 5) is None   # not acted on yet
    # the JSON keeps the keys it always had (web pages and status.json readers)
    js = json.loads(codec.dumps(running))
    assert js["before"] == {"workers": 2, "servers": 1} and js["steps"] == [["add_workers", 2]]
    assert js["run_state"] == "run" and js["group"] is None


def _plan_record(ok: bool) -> PlanRecord:
    plan = Plan([AddOp("a1", 1, Role.SERVER, ("new-0",))], {})
    decision = Decision(time=10.0, trigger="metrics", action="reconfigure", reason="gain", before_s=8.0,
                        after_s=4.5, current_shape=(5, 1), plan=plan)
    run = PlanRun(plan, seconds=2.5, error="" if ok else "add failed")
    run.timings["a1"] = OpTiming("a1", "add", 0.0, 2.5, error="" if ok else "add failed")
    return PlanRecord(decision=decision, started=100.0, shape_before=(5, 1), epoch_started=3, measured_before_s=8.2,
                      run=run, finished=103.0, shape_after=(4, 2), measured_after=[4.0, 4.4],
                      error="" if ok else "add failed")


def test_ps_status_reads_the_cruise_plans_the_am_records() -> None:
    cruise = CruiseStatus(shape=[4, 2], plan_history=[_plan_record(True).record(), _plan_record(False).record()],
                          why_not_ready="measuring")
    status = served({"cruise": cruise, "optimizer": "cruise"})
    assert status.cruise is not None
    p = status.cruise.plan_history[0]
    assert p.run is not None and p.run.ops[0].id == "a1" and p.run.plan["ops"][0]["op"] == "add"
    rows = ps_reports.plan_history_rows(status)
    assert rows[0] == [3, "metrics", "5x1", "4x2", "8.00s -> 4.50s", "8.20s -> 4.20s", "2.50s", 1, "-"]
    assert rows[1][-1] == "add failed"
    assert ps_reports.optimizer_text(status) == "cruise: 4 workers x 2 servers, 2 plans; measuring"


def _tracker() -> HeldoutTracker:
    t = HeldoutTracker(heldout_metric("mlr"), maximize_objective=False, patience=4)
    t.add(HeldoutPoint(0, 0.70, 0.60, {"cross_entropy": 0.70, "true_model_cross_entropy": 0.49}))
    t.add(HeldoutPoint(1, 0.65, 0.50, {"cross_entropy": 0.65, "true_model_cross_entropy": 0.49}))
    t.add(HeldoutPoint(3, 0.72, 0.20, {"cross_entropy": 0.72, "true_model_cross_entropy": 0.49,
                                       "accuracy": math.nan}))
    return t


def _metrics(epochs: int) -> JobMetrics:
    m = JobMetrics(initial_objective=1.6)
    for i in range(epochs):
        m.record_epoch(EpochRecord(i, 1.0 / (i + 2), 0.25, 1000.0 + i))
    return m


def test_the_progress_bar_and_ps_status_read_the_epochs_and_heldout_the_am_records() -> None:
    m = _metrics(4)
    m.record_epoch(EpochRecord(4, math.nan, 0.25, 1004.0))             # a diverged epoch: null in JSON
    status = served({"state": "TRAINING", "epoch": 5, "initial_objective": m.initial_objective,
                     "objective_history": [e.result() for e in m.epochs],
                     "heldout": _tracker().status(None), "spec": {"app": "mlr", "max_epochs": 10}})
    assert status.objective_history[-1].objective is None
    p = ps_reports.progress_from_status(status)
    assert (p.epochs_done, p.max_epochs, len(p.history), p.objective) == (5, 10, 4, 0.2)
    assert p.diverging and p.heldout == "cross_entropy 0.72 (true 0.49)"
    assert "held-out cross_entropy 0.72 (true 0.49)  OVERFITTING" in format_progress(p)
    assert ps_reports.heldout_text(status.heldout) == (
        "cross_entropy 0.72 (true 0.49) after epoch 4, best 0.65 after epoch 2, "
        "early stopping after 4 epochs without improvement")
    assert status.heldout.history[-1].metrics["accuracy"] is None
    disabled = served({"heldout": HeldoutTracker(heldout_metric("mlr"), False).status("model too big")})
    assert disabled.heldout.disabled == "model too big"
    assert ps_reports.heldout_text(disabled.heldout) == "not scored yet (cross_entropy)"


def test_ps_submit_wait_reports_the_final_metrics_the_am_records() -> None:
    final = {"accuracy": 0.77, "cross_entropy": 0.65, "true_model_accuracy": 0.81, "chance_accuracy": 0.2}
    status = served({"app": "mlr", "state": "SUCCEEDED", "initial_objective": 1.6,
                     "objective_history": [e.result() for e in _metrics(3).epochs], "heldout": _tracker().status(),
                     "final_metrics": final, "stop_criterion": "max_epochs"})
    pairs = dict(ps_reports.final_report(WatchResult(app={"id": "a", "state": "FINISHED",
                                                          "finalStatus": "SUCCEEDED"}, status=status)))
    assert pairs["Final-Objective"] == "0.25 after 3 epochs (initial 1.6)"
    assert pairs["Stopped-By"] == "max_epochs"
    assert pairs["Held-Out-Metrics"].startswith("accuracy 0.77, cross_entropy 0.65")
    assert pairs["Vs-True-Model"].startswith("accuracy 0.77 vs true model 0.81")
    assert pairs["Warning"].endswith("the model overfits")


def _pool() -> ExecutorPool:
    """A job's executors as the AM's pool knows them: a server and a worker that announced
    themselves (ExecutorReady) and reported their status, and a worker still launching."""
    pool = ExecutorPool(num_blocks=4, am_address="a:1")
    for seq, role in ((2, ExecutorRole.SERVER), (3, ExecutorRole.WORKER), (4, ExecutorRole.WORKER)):
        pool.add(role, AmContainer(container_id=f"container_1_0001_01_{seq:06d}", node_id="host:1",
                                   node_http_address="host:1", resource=Resource(512, 1), token="t"))
    for eid, port in (("server-0", 7001), ("worker-0", 7002)):
        pool.handle_frame(Frame(ops.to_header(ops.ExecutorReady(executor_id=eid, address=f"host:{port}", pid=port))))
    s0, w0 = pool.executors["server-0"], pool.executors["worker-0"]
    s0.rss_bytes, s0.model_bytes, s0.blocks = 90 * 2**20, 4096, [0, 1, 2, 3]
    w0.rss_bytes, w0.data_bytes, w0.blocks = 100 * 2**20, 3 * 2**19, [0, 1, 2, 4]
    w0.partition, w0.spill_alpha, w0.spilled_bytes, w0.spill_stall_s = 0, 0.25, 2**21, 0.5
    return pool


def _paused_master(tmp_path: Path) -> PSApplicationMaster:
    """An AM (built, not run) whose job paused once for 12 s and sits paused on its cut."""
    am = types.SimpleNamespace(identity=types.SimpleNamespace(attempt_id="appattempt_1_0001_000001",
                                                              job_secret="s"), registration=None)
    spec = ps_job_spec.validate({"app": "mlr", "workers": 2, "servers": 1})
    master = PSApplicationMaster(am, spec, tmp_path / "am")  # type: ignore[arg-type]
    master.job.phase = Phase.PAUSED
    master.pauses, master.paused_s = 1, 12.0
    master.cut = SuspensionCut(epoch=3, clock=2, checkpoint="/ck/3")
    return master


def test_ps_status_reads_the_executors_spec_suspension_and_spill_the_am_records(tmp_path: Path) -> None:
    pool = _pool()
    spec = ps_job_spec.validate({"app": "mlr", "workers": 2, "servers": 1, "max_epochs": 4, "sync": "bsp",
                                 "optimizer": "cruise", "hparams": {"learning_rate": 0.5}})
    sus = _paused_master(tmp_path).suspension_status()
    status = served({"app": "mlr", "state": "TRAINING", "spec": spec.to_json(), "shape": pool.shape_status(),
                     "num_blocks": 4, "suspension": sus, "spill": spill_status(pool.live())})
    assert status.spec == spec                                    # the spec round-trips strictly
    assert ps_reports.executor_rows(status) == [
        ["server-0", "server", "READY", "host:1", "container_1_0001_01_000002", "90.0", "0.000", "0.004", "0-3"],
        ["worker-0", "worker", "READY", "host:1", "container_1_0001_01_000003", "100.0", "1.500", "0.000", "0-2,4"],
        ["worker-1", "worker", "LAUNCHING", "host:1", "container_1_0001_01_000004", "0.0", "0.000", "0.000", "-"]]
    assert ps_scale_command.live_shape(status) == (1, 1)
    pairs = dict(ps_reports.running_report({"id": "a", "state": "RUNNING"}, status)[0])
    assert pairs["App"].startswith("mlr (preset tiny, data")
    assert pairs["Shape"] == "2 workers, 1 server, 4 blocks, sync bsp"
    assert pairs["Optimizer"] == "cruise"
    assert pairs["Colocation"] == "paused, 1 pause (12.0s paused); spill alpha 0.25, 2.0 MB on disk"
    assert status.suspension.cut is not None and status.suspension.cut.checkpoint == "/ck/3"
    # the JSON keeps the keys it always had (the web pages' script reads /status)
    js = json.loads(codec.dumps({"shape": pool.shape_status(), "suspension": sus}))
    assert list(js["shape"]["executors"][1]) == [
        "id", "role", "container_id", "node", "state", "address", "pid", "rss_mb", "data_mb", "model_mb", "blocks",
        "partition", "spill_alpha", "spilled_mb", "spill_stall_s"]
    assert js["shape"]["executors"][1]["address"] == "host:7002" and js["shape"]["executors"][1]["pid"] == 7002
    assert js["suspension"] == {"state": "PAUSED", "pauses": 1, "paused_s": 12.0,
                                "cut": {"epoch": 3, "clock": 2, "checkpoint": "/ck/3"}, "history": []}
    empty = served({})                                             # an AM still starting
    assert ps_reports.executor_rows(empty) == [] and ps_scale_command.live_shape(empty) == (0, 0)
    assert ps_reports.colocation_text(empty) is None and empty.spill is None


def _change() -> EpsChange:
    return ElasticOpRecord(op="add_workers", requested=2, started=1.0, epoch_started=3, workers_before=2,
                           servers_before=1, workers_after=4, servers_after=1, duration_s=1.0).to_history()


def _meta(history: list[Any]) -> ModelMetadata:
    return ModelMetadata(kind="final", epoch=3, app=AppRef(name="mlr", cls="x:Y"), num_keys=4, key_length=2,
                         data={}, hparams={}, shape_history=history)


def test_model_metadata_keeps_the_shape_history_typed_and_reads_old_records(tmp_path: Path) -> None:
    (tmp_path / METADATA_FILE).write_bytes(encode_metadata(_meta([_change()])))
    meta = read_metadata(DurableDir(tmp_path))
    assert meta.shape_history == [_change()]
    assert json.loads((tmp_path / METADATA_FILE).read_bytes())["shape_history"] == history_json([_change()])
    # a record an older AM wrote that no kind here decodes: the model still reads, without it
    raw = msgspec.to_builtins(_meta([]))
    raw["shape_history"] = [{"mode": "resize", "workers": 3}, *history_json([_change()])]
    (tmp_path / METADATA_FILE).write_bytes(json.dumps(raw).encode())
    assert read_metadata(DurableDir(tmp_path)).shape_history == [_change()]
