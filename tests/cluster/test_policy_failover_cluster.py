"""The policy across a real failover (issue 37 part 5): two real RMs on a real etcd running the
`drf` policy, two real NMs and a real PS job that DRF has grown past its submitted shape (a live
EPS reshape). The active RM is SIGKILLed; the new active restores the job's directive and the
policy's state from etcd, holds its policy rounds until both nodes and the job's AM are back, and
its first 3 rounds reshape nothing: /ws/v1/cluster/info's `policyResync` says so, and the job's
directive is the one the old active issued, with the same version."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

import etcd_server as etcdmod
from polling import wait_until
from test_rm_ha_cluster import GATE_ENV, THROTTLE_UNTIL_GATE, NmProcess, RmProcess, call, one_active, running_nodes, \
    started_pair

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(etcdmod.unavailable_reason() is not None,
                                 reason=f"no etcd here: {etcdmod.unavailable_reason()}")]


@pytest.fixture
def drf_pair(etcd: Any, tmp_path: Path) -> Iterator[tuple[RmProcess, RmProcess]]:
    rm_toml = (f'[rm]\npolicy = "drf"\nnm_expiry_s = 60.0\nam_expiry_s = 60.0\n'
               f'checkpoint_dir = "{tmp_path / "apps"}"\n')
    with started_pair(etcd.endpoint, tmp_path, rm_toml) as rms:
        yield rms


def shape(rm: RmProcess, app_id: str) -> dict[str, Any]:
    status, body, _ = call(rm.url + f"/ws/v1/cluster/apps/{app_id}/shape")
    return dict(body.get("shape") or {}) if status == 200 else {}


def resync(rm: RmProcess) -> dict[str, Any]:
    status, body, _ = call(rm.url + "/ws/v1/cluster/info")
    return dict((body.get("clusterInfo") or {}).get("policyResync") or {}) if status == 200 else {}


def test_the_new_active_reshapes_no_job_in_its_first_policy_rounds(drf_pair, tmp_path):
    from appmaster.ps.submission import build_ps_submission     # noqa: PLC0415 (the PS AM's deps: this test only)
    from scripted_am import use_scripted_am                     # noqa: PLC0415

    active, standby = one_active(drf_pair)
    nms = [NmProcess(active.conf, tmp_path, f"nm{i}", active.url, memory_mb=2048, vcores=4) for i in range(2)]
    app_id = ""
    try:
        wait_until(lambda: len(running_nodes(active)) == 2, 30, "both nodes RUNNING", 0.1)
        spec = {"app": "mlr", "workers": 1, "servers": 1, "max_workers": 3, "max_servers": 2, "max_epochs": 100000,
                "convergence_threshold": 1e-12, "executor_memory_mb": 320, "early_feedback_iterations": 1}
        sub = build_ps_submission(spec, name="policy-through-failover", am_memory=384, max_app_attempts=2)
        use_scripted_am(sub, tmp_path, THROTTLE_UNTIL_GATE, {GATE_ENV: str(tmp_path / "gate")})
        status, body, _ = call(active.url + "/ws/v1/cluster/apps/new-application", "POST")
        assert status == 200, body
        app_id = str(body["application-id"])
        status, body, _ = call(active.url + "/ws/v1/cluster/apps", "POST", dict(sub, **{"application-id": app_id}))
        assert status == 202, body

        def carried_out(rm: RmProcess) -> Any:
            """The job's directive once its AM has carried it out (None before)."""
            s = shape(rm, app_id)
            d, cur = s.get("directive"), s.get("current")
            if not d or not cur or cur.get("changing") or cur.get("directive_version") != d["version"]:
                return None
            return d if (cur["workers"], cur["servers"]) == (d["workers"], d["servers"]) else None
        before = wait_until(lambda: carried_out(active), 240, "DRF's directive carried out by the PS AM", 0.3)
        assert before["workers"] + before["servers"] > 2        # grown past its submitted shape

        active.signal(signal.SIGKILL)
        assert active.proc is not None and active.proc.wait(10) == -signal.SIGKILL
        wait_until(lambda: standby.ha_state() == "ACTIVE", 60, f"{standby.rm_id} active after the kill", 0.1)
        done = wait_until(lambda: (lambda r: r if r.get("state") == "DONE" else None)(resync(standby)), 120,
                          "the new active's first 3 policy rounds", 0.2)
        assert done["reshapesAfterFailover"] == 0 and done["clusterChanged"] is False, done
        assert done["countedRounds"] == 3 and done["released"].startswith("everything back"), done
        after = shape(standby, app_id)["directive"]
        assert after == before          # the old active's directive, its version too
    finally:
        if app_id:
            (tmp_path / "gate").touch()
            for rm in drf_pair:
                if rm.ha_state() == "ACTIVE":
                    call(rm.url + f"/ws/v1/cluster/apps/{app_id}/state", "PUT", {"state": "KILLED"})
        codes = [nm.stop() for nm in nms]
    assert codes == [0, 0], "\n".join(nm.log_tail() for nm in nms)
