"""A job that fails in the simulator is counted apart: no JCT, not among the finished, in `failed`.
Its end is no completion -- averaged in, its short time flattered the policy that lost it."""
from __future__ import annotations

from appmaster.ps.controller.records import Role
from appmaster.ps.controller.state import ExecutorState
from sim.calibration import AppCalibration, Calibration
from sim.job_record import JobRecord
from sim.simulator import T0, SimConfig, Simulator
from sim.trace import TraceJob

APP = AppCalibration(theta=[20.0, 0.3, 0.2, 0.05, 0.05], loss_curve=[0.5, 2.0, 0.1], clocks_per_epoch=20.0,
                     am_start_s=2.0, startup_s=3.0, finish_s=1.0, reshape_s=2.0, restart_s=5.0, pause_s=2.0)


def test_a_failed_or_killed_record_has_no_jct() -> None:
    for status, jct in (("SUCCEEDED", 5.0), ("FAILED", None), ("KILLED", None)):
        r = JobRecord("j", "nmf", "u", "q", arrival=1.0, end=6.0, final_status=status)
        assert r.jct == jct and r.failed == (jct is None)


def test_a_job_its_losses_fail_is_counted_apart_from_the_finished() -> None:
    jobs = [TraceJob(name=f"j{i}", arrival_s=0.0, app="nmf", threshold=1e-9, workers=2, servers=1, max_epochs=30)
            for i in range(2)]
    sim = Simulator(jobs, "static", Calibration(apps={"nmf": APP}), SimConfig(nodes=4))

    def kill_a_worker_of_j0() -> None:       # again and again: past its max_executor_failures
        sj = sim.jobs[0]
        if sj.stopped:
            return
        ready = [e.info for e in sj.state.executors.values()
                 if e.role is Role.WORKER and e.state is ExecutorState.READY]
        if ready:
            sim.nodes[ready[0].node].exit(ready[0].container_id, 137, "killed")
    for k in range(12):
        sim.loop.at(T0 + 30.0 + 15.0 * k, kill_a_worker_of_j0)
    res = sim.run()
    status = {r.name: r.final_status for r in res.records}
    assert status == {"j0": "FAILED", "j1": "SUCCEEDED"}
    assert res.summary.finished == 1 and res.summary.failed == 1
    j1 = next(r for r in res.records if r.name == "j1")
    assert res.summary.mean_jct_s == j1.jct
