"""Shape directives from the RM's `eps` policy (EPS's H-scheduler) acted on by a real PS AM.

Two nodes of three 512 MB / 1 vcore slots. Job A (MLR, 2 workers + 2 servers, elastic_mode "kill")
takes five of them; once it has given early feedback, job B (1 worker + 1 server) arrives and
does not fit. The policy tells A to shrink; A's AM diffs the directive against its shape and
restarts itself smaller (the kill-based baseline); B gets the freed containers and finishes. A
trains with no epoch limit in reach until the test has seen (in its AM's status) that it restarted
and trained on, then the test kills it. Checked: A acted on the policy's directives in
version order and recorded each change, A's shape report reached the RM, B succeeds, and A's
training went on from where the restart left it."""
from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import get_app, kill_unless_final, pids_with_env, rest, restarted_and_trained_on, running_cluster, submit_app, wait_app
from protocol.ps_status import PsStatus
from protocol.shape_history import KillRestartChange
from polling import wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def eps_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from rm import policies
    if "eps" not in policies.known():
        pytest.skip("the RM has no eps policy")
    with running_cluster(tmp_path_factory.mktemp("eps-cluster"), nodes=2, node_memory_mb=1536, node_vcores=3,
                         nm_expiry_s=5, am_expiry_s=10, policy="eps") as c:
        yield c


def submit(cluster: Any, spec: dict[str, Any], name: str) -> str:
    return submit_app(cluster.rm_url, build_ps_submission({"executor_memory_mb": 320, **spec}, name=name,
                                                          am_memory=384))


def shape_report(cluster: Any, app_id: str) -> dict[str, Any] | None:
    app = get_app(cluster.rm_url, app_id)
    try:
        return rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/shape") if app["state"] == "RUNNING" else None
    except Exception:  # noqa: BLE001 - the endpoint may not exist in this RM; the final status still checks
        return None


def test_eps_policy_directives_reshape_a_kill_mode_job(eps_cluster) -> None:
    # Job A trains until the test has seen what it checks (epoch limit far away, no convergence):
    # how fast training is does not decide whether the policy had time to act on it.
    a = submit(eps_cluster, {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 100_000,
                             "convergence_threshold": 1e-12, "elastic_mode": "kill",
                             "early_feedback_iterations": 20}, "eps-a")
    seen: dict[str, Any] = {}

    def a_gave_feedback() -> bool:
        rep = shape_report(eps_cluster, a)
        if rep:
            seen["report"] = rep
        return bool(rep) and json.dumps(rep).find('"early_feedback": true') >= 0
    try:
        wait_until(a_gave_feedback, 120, "job A reports early feedback to the RM")

        b = submit(eps_cluster, {"app": "mlr", "workers": 1, "servers": 1, "max_epochs": 3}, "eps-b")
        app_b = wait_app(eps_cluster.rm_url, b, ("FINISHED",), 180)
        assert app_b["finalStatus"] == "SUCCEEDED", app_b["diagnostics"]

        seen["status"] = wait_until(lambda: restarted_and_trained_on(eps_cluster, a), 180,
                                    "job A restarted smaller and trained on")
    finally:
        kill_unless_final(eps_cluster.rm_url, a)
    wait_app(eps_cluster.rm_url, a, ("FINISHED", "FAILED", "KILLED"), 60)
    for app_id in (a, b):
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")

    st: PsStatus = seen["status"]           # A's own status, taken while it trained (before the kill)
    directives = st.directives
    assert directives, "job A got no directive from the eps policy"
    versions = [d.version for d in directives]
    assert versions == sorted(set(versions)), versions          # each version acted on once, in order
    shrink = directives[0]
    assert (shrink.workers, shrink.servers) < (2, 2) and shrink.error == "", shrink
    assert shrink.steps and all(name.startswith("remove_") for name, _ in shrink.steps)
    changes = st.shape_history
    restart = changes[0]
    assert isinstance(restart, KillRestartChange) and restart.changed, changes
    assert (restart.workers, restart.servers) == (shrink.workers, shrink.servers)
    assert restart.objective_restored == pytest.approx(restart.objective_before, rel=1e-4)
    obj = [h.objective for h in st.objective_history]
    assert [h.epoch for h in st.objective_history] == list(range(len(obj)))
    assert None not in obj and st.initial_objective is not None, obj      # every objective finite
    assert obj[-1] < obj[0] < st.initial_objective
