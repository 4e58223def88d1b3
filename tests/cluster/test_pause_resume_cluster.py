"""Pause and resume of a PS job on a real localhost cluster (RM + 3 NMs as processes).

The owner pauses a training MLR job through the RM (`PUT /ws/v1/cluster/apps/{id}/shape` with
`runState` "pause", the same directive Harmony's policy sends): the AM stops at a clock boundary,
checkpoints, and gives every executor container back -- the app holds only its AM. Then it is
resumed with another shape on named nodes: new executors start exactly there, the checkpoint is
restored and training continues the same objective trajectory (the restored objective is the
paused one, epochs carry on with no gap). The job trains with no epoch limit in reach (how fast a
host trains must not decide whether the pause comes before the end); the test kills it once it has
seen what it checks."""
from __future__ import annotations

from pathlib import Path

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import RestError, am_status, get_app, pids_with_env, rest, running_cluster, submit_app, wait_app
from protocol.ps_status import PsStatus
from polling import wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


def test_pause_gives_executors_back_and_resume_continues_the_trajectory(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster") as cluster:
        spec = {"app": "mlr", "workers": 1, "servers": 1, "max_epochs": 100_000, "executor_memory_mb": 320,
                "convergence_threshold": 1e-12, "hparams": {"learning_rate": 0.5}}
        app_id = submit_app(cluster.rm_url, build_ps_submission(spec, name="pausable", am_memory=384))
        shape_path = f"/ws/v1/cluster/apps/{app_id}/shape"

        def status() -> PsStatus | None:
            return am_status(cluster, app_id)

        wait_until(lambda: (s := status()) is not None and (s.epoch or 0) >= 2, 180, "two epochs trained")
        with pytest.raises(RestError) as bad:       # a run state that does not exist: 400, nothing changes
            rest(cluster.rm_url, "PUT", shape_path, {"workers": 1, "servers": 1, "runState": "sleep"}, user="alice")
        assert bad.value.status == 400 and "runState" in str(bad.value.body)
        rest(cluster.rm_url, "PUT", shape_path, {"workers": 1, "servers": 1, "runState": "pause"}, user="alice")

        paused = wait_until(lambda: (s := status()) is not None and s.suspension.state == "PAUSED" and s,
                            120, "the job paused")
        cut = paused.suspension.cut
        assert cut is not None and Path(cut.checkpoint).is_dir()
        # Every executor container given back: the app holds its AM alone, no executor process left.
        wait_until(lambda: get_app(cluster.rm_url, app_id)["runningContainers"] == 1, 60,
                   "only the AM container left")
        wait_until(lambda: not [p for p in pids_with_env(container_env.APP_ID, app_id)
                                if _is_executor(p)], 60, "the executors' processes gone")
        # ... and the job report the policies read says so (on the AM's next allocate).
        wait_until(lambda: (r := rest(cluster.rm_url, "GET", shape_path)["shape"]["current"])["paused"]
                   and (r["workers"], r["servers"]) == (0, 0), 30, "the RM's job report says paused")
        epoch_at_pause = paused.epoch or 0

        # Resume with 2 workers and 1 server on the two nodes that do not hold the AM.
        am_node = rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/appattempts")[
            "appAttempts"]["appAttempt"][-1]["nodeId"]
        nodes = sorted(n["id"] for n in rest(cluster.rm_url, "GET", "/ws/v1/cluster/nodes")["nodes"]["node"]
                       if n["id"] != am_node)
        rest(cluster.rm_url, "PUT", shape_path, {"workers": 2, "servers": 1, "nodes": nodes, "runState": "resume"},
             user="alice")

        st = wait_until(lambda: (s := status()) is not None and s.suspension.state == "RUNNING"
                        and (s.epoch or 0) >= cut.epoch + 3 and s, 180, "three epochs trained after the resume")
        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_app(cluster.rm_url, app_id, ("KILLED",), 60)

    sus = st.suspension
    assert sus.state == "RUNNING" and sus.pauses == 1 and sus.paused_s > 0
    pause, resume = sus.history
    assert (pause.op, resume.op) == ("pause", "resume")
    assert resume.objective_restored == pytest.approx(pause.objective_before, rel=1e-4)   # no reset
    assert (resume.workers, resume.servers, resume.nodes) == (2, 1, nodes)
    # The new executors ran exactly on the named nodes; the old ones are the first generation.
    assert st.shape is not None
    executors = st.shape.executors
    assert [e.role for e in executors].count("worker") == 1 + 2
    later = [e for e in executors if e.id not in {x.id for x in executors[:2]}]
    assert {e.node for e in later} <= set(nodes) and len(later) == 3
    # Epochs carry on without a gap or a reset: the first epoch after the resume starts from the cut.
    history = st.objective_history
    assert [h.epoch for h in history] == list(range(len(history)))
    obj = [st.initial_objective] + [h.objective for h in history]
    assert None not in obj and st.initial_objective is not None and pause.objective_before is not None, obj
    assert pause.epoch >= epoch_at_pause - 1 and obj[pause.epoch + 1] < 1.02 * pause.objective_before
    assert obj[-1] < 0.6 * st.initial_objective


def _is_executor(pid: int) -> bool:
    try:
        return b"psruntime.executor" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
