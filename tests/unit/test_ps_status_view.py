"""The PS AM's job status is one record: appmaster.ps.runtime.status_view builds a PsStatus from the AM's
own parts, `/status` and status.json are its encoding, and decoding that gives the same record
back, under the JSON keys the status always had. The checkpoint job record the AM writes is a
JobRecord that round-trips inside its JobCheckpoint. No processes: the AM is built, not run."""
from __future__ import annotations

import json
import math
import types
from pathlib import Path

import msgspec
import pytest

from appmaster.ps.runtime.master import PSApplicationMaster
from appmaster.ps.metrics import EpochRecord
from appmaster.ps.stragglers import Straggler
from protocol import ps_job_spec
from protocol.checkpoint_manifest import OwnershipTableRecord, decode_job_checkpoint, encode_job_checkpoint, job_checkpoint
from protocol.ps_status import EpochResult, PsStatus, ResumedFrom, decode_status, encode_status, read_status
from protocol.shape_history import EpsChange, ExecutorCounts

# The keys `/status` served before it was one record (the web of readers depends on them).
STATUS_KEYS = {
    "app", "attempt_id", "application_id", "state", "diagnostics", "spec", "started", "shape", "num_blocks",
    "table_version", "epoch", "max_epochs", "converged", "clocks", "clock_batches", "initial_objective",
    "objective_history", "metrics", "checkpoints", "heldout", "stop_criterion", "final_metrics", "model_mb",
    "data_mb", "elastic_mode", "shape_history", "directives", "eps", "optimizer", "cruise", "resumed_from",
    "recovery", "suspension", "spill", "stragglers",
    "shape_changes"}      # added since: the count of every change (shape_history keeps the newest)
ATTEMPT = "appattempt_1700000000000_0001_000001"


def _master(tmp_path: Path, **spec: object) -> PSApplicationMaster:
    # the AM library's part the master uses unstarted: its identity, no registration yet, and the
    # shape reports it would send the RM (kept in `reports`)
    am = types.SimpleNamespace(identity=types.SimpleNamespace(attempt_id=ATTEMPT, job_secret="the-job-secret"),
                               registration=None, reports=[])
    am.set_shape = am.reports.append
    job = ps_job_spec.validate({"app": "mlr", "workers": 2, "servers": 1, "max_epochs": 3, **spec})
    return PSApplicationMaster(am, job, tmp_path / "am")  # type: ignore[arg-type]


async def test_a_starting_ams_status_round_trips_under_the_keys_it_always_had(tmp_path: Path) -> None:
    master = _master(tmp_path)
    status = master.status()
    raw = encode_status(status)
    assert set(json.loads(raw)) == STATUS_KEYS
    assert read_status(raw) == status == decode_status(json.loads(raw))
    assert (status.app, status.attempt_id, status.application_id, status.state) == ("mlr", ATTEMPT, None, "STARTING")
    assert status.spec == master.spec and status.max_epochs == 3 and status.elastic_mode == "eps"
    assert status.eps is not None and status.eps.limits is None          # no splits before training is set up
    assert status.recovery is not None and status.recovery.enabled and status.recovery.max_executor_failures == 3
    assert status.stragglers is not None and status.stragglers.replaced == []


async def test_what_the_ams_parts_recorded_is_in_the_decoded_status(tmp_path: Path) -> None:
    master = _master(tmp_path)
    master.metrics.initial_objective = 1.6
    master.metrics.record_batches("worker-0", [0.02, 0.04], [0.01, 0.01], bytes_moved=4096)
    master.metrics.record_server("server-0", 10, 0.5)
    master.metrics.record_server("server-0", 30, 1.5)
    master.metrics.record_epoch(EpochRecord(epoch=0, objective=0.9, epoch_time_s=1.5, time=1.7e9))
    master.metrics.record_epoch(EpochRecord(epoch=1, objective=math.nan, epoch_time_s=1.25, time=1.7e9 + 2))
    added = EpsChange(changed=True, op="add_workers", requested=1, before=ExecutorCounts(2, 1), workers=3,
                      servers=1, time=1.7e9 + 1, seconds=2.5, lost_s=0.25, splits_moved=7)
    master.record_shape_change(added)
    assert master.am.reports, "a shape change is reported to the RM"  # type: ignore[attr-defined]
    master.stragglers.record(Straggler("worker-1", seconds=0.5, peers_median=0.1), "worker-3")
    master.resumed_from = ResumedFrom(dir="/ck/epoch-1", url="s3://b/ck/epoch-1", epoch=1, clock=0,
                                      attempt_id=ATTEMPT, objective=0.9, objective_restored=0.9000001,
                                      checkpoint_time=1.7e9, time=1.7e9 + 5)
    back = decode_status(json.loads(encode_status(master.status())))
    assert back.initial_objective == 1.6
    assert back.objective_history == [EpochResult(epoch=0, objective=0.9, epoch_time_s=1.5, time=1.7e9),
                                      EpochResult(epoch=1, objective=None, epoch_time_s=1.25, time=1.7e9 + 2)]
    w = back.metrics.workers["worker-0"]
    assert (w.compute_s, w.comm_s, w.batches, w.bytes_per_batch) == pytest.approx((0.02 * 0.9 + 0.04 * 0.1, 0.01,
                                                                                   2, 2048.0))
    s = back.metrics.servers["server-0"]
    assert s.requests == 30 and s.service_s == pytest.approx(0.05)
    assert back.shape_history == [added]
    assert back.stragglers is not None and back.stragglers.replaced[0].replacement == "worker-3"
    assert back.resumed_from == master.resumed_from


async def test_a_kill_mode_job_has_no_eps_section(tmp_path: Path) -> None:
    status = _master(tmp_path, elastic_mode="kill").status()
    assert status.eps is None and status.elastic_mode == "kill"
    assert json.loads(encode_status(status))["eps"] is None


async def test_the_job_record_the_am_checkpoints_round_trips_in_its_job_json(tmp_path: Path) -> None:
    master = _master(tmp_path)
    master.metrics.initial_objective = 1.6
    master.metrics.record_epoch(EpochRecord(epoch=0, objective=0.9, epoch_time_s=1.5, time=1.7e9))
    master.record_shape_change(EpsChange(changed=False, op="add_servers", requested=1, before=ExecutorCounts(2, 1),
                                         workers=None, servers=None, time=1.0, seconds=0.1, lost_s=0.0,
                                         error="no room"))
    job = msgspec.structs.replace(master.job_record(), objective=0.9, reason="pause", positions={3: (1, 40)})
    assert job.spec == master.spec and job.attempt_id == ATTEMPT and job.shape_history == master.shape_history
    table = OwnershipTableRecord(num_blocks=master.spec.num_blocks, owners=["server-0"] * master.spec.num_blocks)
    rec = job_checkpoint(job, epoch=1, clock=2, time=1.7e9, num_blocks=master.spec.num_blocks, table=table,
                         servers=["server-0"], worker_state=False)
    back = decode_job_checkpoint(encode_job_checkpoint(rec))
    assert back == rec and back.objective_history == [EpochResult(epoch=0, objective=0.9, epoch_time_s=1.5,
                                                                  time=1.7e9)]
    assert back.positions == {3: (1, 40)} and back.shape_history[0].error == "no room"


def test_an_empty_status_decodes_with_every_default() -> None:
    # an AM still starting, or an older one, may leave sections out
    assert decode_status({}) == PsStatus()
    with pytest.raises(msgspec.ValidationError, match="epoch"):
        decode_status({"epoch": "three"})
