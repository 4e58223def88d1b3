"""The `dorm` policy (and the `drf` and `tetris` baselines, the same way) driving real PS AMs on a
local cluster.

Two nodes of three 1-vcore slots (320 MB executors, 384 MB AMs). Job A (MLR, 1 worker + 1 server,
up to 2 + 2; elastic_mode "eps", or "kill" under drf) starts; Dorm solves again once it runs and,
the cluster having room, grows it to 2 + 2 with a placement; A's AM adds the executors on the named
nodes, in place (EPS) or by restarting itself bigger (the kill-based baseline). Job B (1 + 1) arrives and does not fit: Dorm shrinks A (its θ2 budget allows one running
job to be resized), A gives executors back, B starts and finishes. A trains on with no epoch
limit in reach until the test has seen both changes in its AM's status, then the test kills it."""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import am_status, app_post_mortem, kill_unless_final, pids_with_env, running_cluster, submit_app, wait_app
from protocol.ps_status import DirectiveRecord, PsStatus
from protocol.shape_history import EpsChange, KillRestartChange
from polling import wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


# The policy, and how job A carries its directives out: in place (EPS) or by the kill-based restart
# (Dorm's own checkpoint-kill-resume protocol).
MODES = {"dorm": "eps", "drf": "kill", "tetris": "eps"}


@pytest.fixture(scope="module", params=sorted(MODES))
def policy_cluster(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    with running_cluster(tmp_path_factory.mktemp(f"{request.param}-cluster"), nodes=2, node_memory_mb=1536,
                         node_vcores=3, nm_expiry_s=5, am_expiry_s=10, policy=request.param) as c:
        yield c, request.param


def submit(cluster: Any, spec: dict[str, Any], name: str) -> str:
    return submit_app(cluster.rm_url, build_ps_submission({"executor_memory_mb": 320, **spec}, name=name,
                                                          am_memory=384))


def done_directives(cluster: Any, app_id: str, seen: dict[str, PsStatus]) -> list[DirectiveRecord]:
    """The directives A's AM has finished acting on (its status), remembered in `seen`."""
    st = am_status(cluster, app_id)
    if st:
        seen["status"] = st
    return [d for d in (st.directives if st else []) if d.seconds > 0 or d.error]


def test_policy_grows_a_job_in_place_then_shrinks_it_for_an_arriving_one(policy_cluster) -> None:
    dorm_cluster, policy = policy_cluster
    a = submit(dorm_cluster, {"app": "mlr", "workers": 1, "servers": 1, "max_workers": 2, "max_servers": 2,
                              "max_epochs": 100_000, "convergence_threshold": 1e-12,
                              "elastic_mode": MODES[policy]}, "dorm-a")
    b = None
    seen: dict[str, PsStatus] = {}
    try:
        def grown() -> bool:
            return any((d.workers, d.servers) == (2, 2) for d in done_directives(dorm_cluster, a, seen))
        wait_until(grown, 120, "job A grown to 2 workers + 2 servers by the policy")

        b = submit(dorm_cluster, {"app": "mlr", "workers": 1, "servers": 1, "max_epochs": 2}, "dorm-b")
        app_b = wait_app(dorm_cluster.rm_url, b, ("FINISHED",), 180)
        assert app_b["finalStatus"] == "SUCCEEDED", app_b["diagnostics"]

        def shrunk() -> bool:
            return any(d.workers + d.servers < 4 for d in done_directives(dorm_cluster, a, seen))
        wait_until(shrunk, 60, "job A's shrink for job B acted on")
    except AssertionError as e:
        e.add_note(app_post_mortem(dorm_cluster, a))
        raise
    finally:
        kill_unless_final(dorm_cluster.rm_url, a)
    wait_app(dorm_cluster.rm_url, a, ("FINISHED", "FAILED", "KILLED"), 60)
    for app_id in (a, b):
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")

    status = seen["status"]
    directives = status.directives
    versions = [d.version for d in directives]
    assert versions == sorted(set(versions)), versions          # each version acted on once, in order
    grow = next(d for d in directives if (d.workers, d.servers) == (2, 2))
    assert grow.error == "" and grow.reason.startswith(policy + ":") and grow.nodes, grow
    assert all(name.startswith("add_") for name, _ in grow.steps), grow
    shrink = next(d for d in directives if d.version > grow.version and d.workers + d.servers < 4)
    assert shrink.error == "" and any(name.startswith("remove_") for name, _ in shrink.steps), shrink
    assert status.spec is not None and status.spec.elastic_mode == MODES[policy]
    changes = status.shape_history          # what A's mechanism recorded for each change
    mechanism = {"eps": EpsChange, "kill": KillRestartChange}[MODES[policy]]
    assert changes and all(isinstance(c, mechanism) for c in changes), changes
