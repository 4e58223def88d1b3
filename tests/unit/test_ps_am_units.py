"""Pure parts of the PS AM: the job's lifecycle (the PS-job controller's LIFECYCLE table), moving averages, the executor pool's naming,
launch command, announcements and exit descriptions, and the status server's HTTP surface."""
from __future__ import annotations

import dataclasses

import aiohttp
import pytest

from appmaster.container_book import AmContainer
from appmaster.ps.runtime.executor_pool import ExecutorPool, ExecutorState, Role
from appmaster.ps.controller.phases import LIFECYCLE, JobTransitionError, Phase, Trigger
from appmaster.ps.controller.planners.base import fire
from appmaster.ps.controller.state import JobState
from appmaster.ps.metrics import DEFAULT_ALPHA, JobMetrics, MovingAverage, ServerTimes
from appmaster.ps.runtime.status_server import StatusServer
from protocol import codec, ps_job_spec
from protocol import executor_ops as ops
from protocol.job_report import (MAX_EPOCH_TIMES, MAX_OBJECTIVES, JobReport, finite, recent_epoch_times,
                                 recent_objectives)
from protocol.internal_api import NodePlacement
from protocol.records import Resource
from protocol.ps_status import CheckpointInfo, PsStatus, decode_status
from protocol.remote_exception import Conflict
from psruntime.wire.dataplane import RequestError
from psruntime.wire.frame_codec import Frame


def _job(phase: Phase = Phase.STARTING) -> JobState:
    job = JobState(spec=ps_job_spec.validate({"app": "mlr"}))
    job.phase = phase
    return job


def test_job_runs_forward_to_succeeded() -> None:
    job = _job()
    for t in (Trigger.REGISTERED, Trigger.SERVERS_READY, Trigger.WORKERS_READY, Trigger.INITIALISED,
              Trigger.TRAINED):
        fire(job, t)
    assert job.phase is Phase.FINISHING and job.phase.executors_expected_alive
    fire(job, Trigger.FINISHED, "final objective 1")
    assert job.phase is Phase.SUCCEEDED and job.diagnostics == "final objective 1"
    assert not job.phase.executors_expected_alive
    assert [t for _, t, _ in job.history] == ["REGISTERED", "SERVERS_READY", "WORKERS_READY", "INITIALISED",
                                              "TRAINED", "FINISHED"]


def test_job_fails_or_stops_from_any_live_phase_and_final_phases_are_final() -> None:
    for phase in Phase:
        for t in (Trigger.FAIL, Trigger.STOP):
            if phase.is_final:
                assert (phase, t) not in LIFECYCLE
            else:
                assert LIFECYCLE[(phase, t)] in (Phase.FAILED, Phase.KILLED)
        if phase.is_final:            # nothing leaves a final phase
            assert not any(LIFECYCLE.allows(phase, t) for t in Trigger)
    job = _job(Phase.TRAINING)
    fire(job, Trigger.FAIL, "worker-1 died")
    assert job.phase is Phase.FAILED and job.diagnostics == "worker-1 died"
    assert not LIFECYCLE.allows(job.phase, Trigger.FAIL)
    with pytest.raises(JobTransitionError, match="TRAINED is not allowed in phase STARTING"):
        fire(_job(), Trigger.TRAINED)


def test_moving_average_and_server_service_time() -> None:
    m = MovingAverage(alpha=0.5)
    assert m.value is None
    m.add_all([4.0, 2.0, 1.0])
    assert m.value == pytest.approx(2.0) and m.count == 3      # 4 -> 3 -> 2
    with pytest.raises(ValueError):
        MovingAverage(alpha=0)
    s = ServerTimes()
    s.update(10, 0.5)                 # 10 requests in 0.5 s
    s.update(30, 1.5)                 # 20 more in 1.0 s: still 0.05 s each
    assert s.service_s.value == pytest.approx(0.05) and s.requests == 30
    s.update(30, 1.5)                 # nothing new: unchanged
    assert s.service_s.count == 2
    jm = JobMetrics()
    jm.record_batches("worker-0", [0.1, 0.1], [0.2, 0.2])
    assert jm.to_json()["workers"]["worker-0"] == {"compute_s": pytest.approx(0.1), "comm_s": pytest.approx(0.2),
                                                   "batches": 2, "compute_wait_s": 0.0, "comm_wait_s": 0.0,
                                                   "bytes_per_batch": None}


def test_job_report_timings_average_the_live_executors_measured() -> None:
    jm = JobMetrics()
    jm.record_batches("worker-0", [0.1], [0.2])
    jm.record_batches("worker-1", [0.3], [0.4])
    jm.record_batches("worker-9", [9.0], [9.0])      # retired: not asked for
    jm.record_server("server-0", 10, 0.5)
    jm.record_server("server-1", 0, 0.0)            # served nothing yet: unknown, not 0
    live = {"worker-0", "worker-1", "worker-2", "server-0", "server-1"}
    w = jm.worker_timing(live)
    assert (w.compute_s, w.comm_s, w.workers) == (pytest.approx(0.2), pytest.approx(0.3), 2)
    s = jm.server_timing(live)
    assert (s.service_s, s.servers) == (pytest.approx(0.05), 1)
    assert JobMetrics().worker_timing(live).workers == 0 and JobMetrics().server_timing(live).servers == 0


def test_job_report_separates_time_held_from_time_waited_for_a_grant() -> None:
    jm = JobMetrics()
    # worker-0 waited 0.3 s of each 0.4 s COMP for its partner's COMP to end; worker-1 none
    jm.record_batches("worker-0", [0.4], [0.2], [0.3], [0.05])
    jm.record_batches("worker-1", [0.2], [0.2])
    w = jm.worker_timing({"worker-0", "worker-1"})
    assert (w.compute_s, w.compute_wait_s, w.compute_held_s) == (pytest.approx(0.3), pytest.approx(0.15),
                                                                 pytest.approx(0.15))
    assert (w.comm_s, w.comm_wait_s, w.comm_held_s) == (pytest.approx(0.2), pytest.approx(0.025),
                                                        pytest.approx(0.175))


def test_job_report_bytes_per_batch_averages_the_workers_that_count_them() -> None:
    jm = JobMetrics()
    # worker-0: a clock of 2 mini-batches moving 3000 bytes in all, then one of 4 moving 4000
    # (1500 then 1000 per mini-batch; the second folded in as 4 samples of the average)
    jm.record_batches("worker-0", [0.1, 0.1], [0.2, 0.2], bytes_moved=3000)
    jm.record_batches("worker-0", [0.1] * 4, [0.2] * 4, bytes_moved=4000)
    jm.record_batches("worker-1", [0.1], [0.2], bytes_moved=2000)
    jm.record_batches("worker-2", [0.1], [0.2])                  # an executor that does not count bytes
    w0 = 1500.0 + (1.0 - (1.0 - DEFAULT_ALPHA) ** 4) * (1000.0 - 1500.0)
    w = jm.worker_timing({"worker-0", "worker-1", "worker-2"})
    assert w.workers == 3 and w.bytes_per_batch == pytest.approx((w0 + 2000.0) / 2)
    assert JobMetrics().worker_timing({"worker-0"}).bytes_per_batch == 0.0


def test_job_report_histories_are_bounded_and_finite() -> None:
    times = recent_epoch_times([float(i) for i in range(MAX_EPOCH_TIMES + 5)] + [float("nan")])
    assert len(times) == MAX_EPOCH_TIMES and times[-1] == MAX_EPOCH_TIMES + 4
    objs = recent_objectives([(i, 1.0 / (i + 1)) for i in range(MAX_OBJECTIVES + 3)] + [(999, float("inf"))])
    assert len(objs) == MAX_OBJECTIVES and objs[0].epoch == 3 and objs[-1].epoch == MAX_OBJECTIVES + 2
    assert finite(float("nan")) is None and finite(None) is None and finite(0.5) == 0.5
    # What the AM builds from them decodes on the RM side (JSON has no NaN: it would be null).
    rep = JobReport(workers=1, servers=1, epoch_times=times, objectives=objs, initial_objective=finite(float("nan")))
    assert JobReport.decode(codec.loads(codec.dumps(rep))) == rep


def _container(seq: int, exit_status: int = -1000, diagnostics: str = "") -> AmContainer:
    return AmContainer(container_id=f"container_1_0001_01_{seq:06d}", node_id="host:1", node_http_address="host:1",
                       resource=Resource(512, 1), token="t", exit_status=exit_status, diagnostics=diagnostics)


async def test_executor_pool_names_launches_and_hears_announcements() -> None:
    pool = ExecutorPool(num_blocks=8, am_address="127.0.0.1:5000")
    s0 = pool.add(Role.SERVER, _container(2))
    w0 = pool.add(Role.WORKER, _container(3))
    w1 = pool.add(Role.WORKER, _container(4))
    assert [s0.executor_id, w0.executor_id, w1.executor_id] == ["server-0", "worker-0", "worker-1"]
    ctx = pool.launch_context(w1)
    cmd = ctx.commands[0]
    assert cmd.startswith("python -m psruntime.executor --executor-id worker-1 --role worker --num-blocks 8 "
                          "--am 127.0.0.1:5000") and "NM_HOST" in cmd
    with pytest.raises(RequestError, match="unknown executor"):
        pool.handle_frame(Frame({"op": "executor_ready", "executor_id": "worker-9", "address": "h:1"}))
    with pytest.raises(RequestError, match="address"):
        pool.handle_frame(Frame({"op": "executor_ready", "executor_id": "worker-0", "address": 7}))
    with pytest.raises(RequestError, match="unknown op"):
        pool.handle_frame(Frame({"op": "epoch_report"}))
    assert w0.state is ExecutorState.LAUNCHING
    pool.handle_frame(Frame({"op": "executor_ready", "executor_id": "worker-0", "address": "h:1", "pid": 42}))
    with pytest.raises(TimeoutError, match=r"1 of 2 workers ready .*worker-1"):
        await pool.wait_ready(Role.WORKER, 2, timeout_s=0.05)
    pool.handle_frame(Frame({"op": "executor_ready", "executor_id": "worker-1", "address": "h:2", "pid": 43}))
    assert [w.executor_id for w in await pool.wait_ready(Role.WORKER, 2, timeout_s=1)] == ["worker-0", "worker-1"]
    shape = pool.shape_status()
    assert (shape.workers, shape.servers) == (2, 1) and shape.executors[0].id == "server-0"


def test_an_announcement_is_the_executor_ready_record_decoded_once_and_a_bad_one_names_its_field() -> None:
    pool = ExecutorPool(num_blocks=4, am_address="a:1")
    w0 = pool.add(Role.WORKER, _container(2))
    ready = ops.ExecutorReady(executor_id="worker-0", address="h:7001", pid=42, role="worker")
    bad = [({"executor_id": "worker-0", "address": "h:1", "pid": "42"}, r"got `str` - at `\$\.pid`"),
           ({"address": "h:1"}, "missing required field `executor_id`"),
           ({"executor_id": "worker-0", "address": "h"}, r"at `\$\.address`"),            # not host:port
           ({"executor_id": "worker-0", "address": "h:1", "role": "boss"}, r"at `\$\.role`"),
           ({"executor_id": "worker-0", "address": "h:1", "port": 1}, "unknown field `port`")]
    for header, field in bad:
        with pytest.raises(RequestError, match=field):
            pool.handle_frame(Frame({"op": "executor_ready", **header}))
    assert w0.state is ExecutorState.LAUNCHING           # refused before anything changed
    reply, arrays = pool.handle_frame(Frame({**ops.to_header(ready), "id": 3}))    # as the executor sends it
    assert ops.decode_reply(reply, ops.REPLY_TYPES[ops.ExecutorReady]) == ops.Ok() and arrays == ()
    assert (w0.state, w0.address, w0.pid) == (ExecutorState.READY, "h:7001", 42)


def test_a_pool_is_placed_as_a_directive_says_only_with_its_per_node_counts() -> None:
    pool = ExecutorPool(num_blocks=4, am_address="a:1")

    def on(seq: int, node: str) -> AmContainer:
        return dataclasses.replace(_container(seq), node_id=node)

    # First fit: both servers on n1, both workers on n2.
    pool.add(Role.SERVER, on(2, "n1"))
    pool.add(Role.SERVER, on(3, "n1"))
    pool.add(Role.WORKER, on(4, "n2"))
    pool.add(Role.WORKER, on(5, "n2"))
    spread = (NodePlacement(node="n1", workers=1, servers=1), NodePlacement(node="n2", workers=1, servers=1))
    assert pool.placed(("n1", "n2"))                    # the node set alone: every executor on it
    assert not pool.placed(("n1", "n2"), spread)        # one worker + one server on each: no
    assert not pool.placed(("n1",))
    assert pool.placed(())                               # no placement: anywhere
    by_role = (NodePlacement(node="n1", servers=2), NodePlacement(node="n2", workers=2))
    assert pool.placed(("n1", "n2"), by_role)
    # A retired executor no longer counts.
    pool.retire(pool.executors["server-1"])
    assert not pool.placed(("n1", "n2"), by_role)
    assert pool.placed(("n1", "n2"), (NodePlacement(node="n1", servers=1), NodePlacement(node="n2", workers=2)))


def test_exit_description_names_executor_role_container_and_reason() -> None:
    pool = ExecutorPool(num_blocks=4, am_address="a:1")
    rec = pool.add(Role.SERVER, _container(3))
    pool.mark_exited(_container(3, -104, "Container killed: memory 600 MB over 512 MB"))
    assert rec.state is ExecutorState.EXITED
    text = rec.describe_exit(512)
    assert text.startswith("server-0 (server, container_1_0001_01_000003 on host:1) exited with -104 "
                           "(KILLED_EXCEEDED_PMEM): over its 512 MB limit; Container killed")
    assert pool.mark_exited(_container(99)) is None
    assert "exited with 137 (exit code 137)" in pool.add(Role.WORKER, _container(5, 137)).describe_exit(512)


async def test_status_server_serves_status_and_checkpoint_errors() -> None:
    calls = []

    async def checkpoint() -> CheckpointInfo:
        calls.append(1)
        if len(calls) == 1:
            return CheckpointInfo(epoch=3, dir="/x/epoch-3")
        raise Conflict("no checkpoint in phase FAILED")

    server = StatusServer(lambda: PsStatus(state="TRAINING", epoch=3), checkpoint)
    url = await server.start()
    try:
        async with aiohttp.ClientSession() as s:
            for path in ("", "status"):
                async with s.get(url + path) as r:
                    st = decode_status(await r.json())     # the PsStatus the AM built, decoded as such
                    assert r.status == 200 and (st.state, st.epoch, st.converged) == ("TRAINING", 3, False)
            async with s.post(url + "checkpoint") as r:
                assert r.status == 200 and (await r.json())["dir"] == "/x/epoch-3"
            async with s.post(url + "checkpoint") as r:
                assert r.status == 409
                assert "FAILED" in (await r.json())["RemoteException"]["message"]
    finally:
        await server.stop()


def test_am_entry_point_refuses_a_bad_or_missing_spec(tmp_path, monkeypatch, capsys) -> None:
    from appmaster.ps.__main__ import main
    from protocol.ps_job_spec import PS_SPEC_ENV

    monkeypatch.setattr("protocol.daemon.install_uvloop", lambda: None)   # keep the test session's loop policy
    monkeypatch.delenv(PS_SPEC_ENV, raising=False)
    assert main([]) == 2 and PS_SPEC_ENV in capsys.readouterr().err
    bad = tmp_path / "spec.json"
    bad.write_text('{"app": "mlr", "workers": 0}')
    assert main(["--spec", str(bad)]) == 2
    assert "invalid job spec: workers: " in capsys.readouterr().err
    monkeypatch.setenv(PS_SPEC_ENV, '{"app": "mlr"}')       # valid, but not inside an AM container
    for var in ("ELASTANE_RM_ADDRESS", "ELASTANE_AM_TOKEN", "APPLICATION_ATTEMPT_ID"):
        monkeypatch.delenv(var, raising=False)
    assert main(["--am-dir", str(tmp_path)]) == 2
    assert "build_ps_submission" in capsys.readouterr().err
