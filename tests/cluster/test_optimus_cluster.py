"""`--policy optimus` driving real PS AMs on a local cluster.

Two nodes of three 320 MB / 1 vcore slots (an AM takes one). Job A (MLR, 1 worker + 1 server, may
grow to 2 + 2, EPS in-place reshaping) trains alone: once its loss curve and epoch times are
known, Optimus grows it into the free slots with a placement, and A's AM carries the directive out.
Then job B (1 + 1, two epochs) arrives and does not fit: Optimus shrinks A to make room, A's AM
carries that out too, and B runs to success. A trains with no epoch limit in reach until the test
has seen both changes in its AM's status; then the test kills it."""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import am_status, kill_unless_final, pids_with_env, rest, running_cluster, submit_app, wait_app
from protocol.ps_status import PsStatus
from polling import wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def optimus_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("optimus-cluster"), nodes=2, node_memory_mb=1536, node_vcores=3,
                         nm_expiry_s=5, am_expiry_s=10, policy="optimus") as c:
        yield c


def submit(cluster: Any, spec: dict[str, Any], name: str) -> str:
    return submit_app(cluster.rm_url, build_ps_submission({"executor_memory_mb": 320, **spec}, name=name,
                                                          am_memory=384))


def changes(st: PsStatus) -> list[tuple[int, int]]:
    """The shapes A's AM reshaped to with EPS's operations, in order (those that took effect)."""
    return [(c.after.workers, c.after.servers) for c in (st.eps.history if st.eps else [])
            if c.ok and c.after is not None and c.after.workers is not None and c.after.servers is not None]


def check_clock_objectives(shape: dict[str, Any]) -> None:
    """The job report the RM holds for a running job carries the objective every few clocks
    (JobReport.clock_objectives, appmaster.ps.clock_objectives; what Optimus fits on): later points
    at more iterations and epochs, mid-epoch ones among them, whole-epoch ones the report's epoch
    objectives themselves, and the others on the way from one epoch's objective to the next's."""
    report = shape["current"]
    points = [(p["iteration"], p["epochs"], p["objective"]) for p in report["clock_objectives"]]
    assert len(points) >= 4, points
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(points, points[1:])), points
    # the objective after k epochs: the initial one, then epoch k - 1's (reports number epochs from 0)
    after = {0: report["initial_objective"], **{o["epoch"] + 1: o["objective"] for o in report["objectives"]}}
    whole = [(e, o) for _, e, o in points if e == int(e) and int(e) in after]
    # The report keeps only its latest epochs' objectives, and points are thinned evenly over the
    # whole run: on a long run the mid-epoch points left may all lie before the epochs it still holds.
    assert whole and any(e != int(e) for _, e, _ in points), points
    mid = [(e, o) for _, e, o in points if e != int(e) and int(e) in after and int(e) + 1 in after]
    assert all(o == pytest.approx(after[int(e)], rel=1e-9) for e, o in whole), (whole, after)
    for e, o in mid:        # SGD's objective within an epoch: about between the epoch's start and end
        lo, hi = sorted((after[int(e)], after[int(e) + 1]))
        assert 0.9 * lo <= o <= 1.1 * hi, (e, o, lo, hi)


def test_optimus_grows_a_job_then_shrinks_it_for_a_newcomer(optimus_cluster) -> None:
    a = submit(optimus_cluster, {"app": "mlr", "workers": 1, "servers": 1, "max_workers": 2, "max_servers": 2,
                                 "max_epochs": 100_000, "convergence_threshold": 1e-12}, "optimus-a")
    seen: dict[str, PsStatus] = {}
    b = None
    try:
        def a_grew() -> bool:
            st = am_status(optimus_cluster, a)
            if st and any(w + s > 2 for w, s in changes(st)):
                seen["grown"] = st
                return True
            return False
        wait_until(a_grew, 150, "job A grown by the optimus policy")

        b = submit(optimus_cluster, {"app": "mlr", "workers": 1, "servers": 1, "max_epochs": 2}, "optimus-b")

        def a_shrank() -> bool:
            st = am_status(optimus_cluster, a)
            shapes = changes(st) if st else []
            grown = [i for i, (w, s) in enumerate(shapes) if w + s > 2]
            if grown and any(w + s < sum(shapes[grown[0]]) for w, s in shapes[grown[0] + 1:]):
                seen["shrunk"] = st
                return True
            return False
        wait_until(a_shrank, 120, "job A shrunk to make room for job B")
        check_clock_objectives(rest(optimus_cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{a}/shape")["shape"])
        app_b = wait_app(optimus_cluster.rm_url, b, ("FINISHED",), 180)
        assert app_b["finalStatus"] == "SUCCEEDED", app_b["diagnostics"]
    finally:
        for app_id in (a, b):
            if app_id:
                kill_unless_final(optimus_cluster.rm_url, app_id)
    for app_id in (a, b):
        if app_id:
            wait_app(optimus_cluster.rm_url, app_id, ("FINISHED", "FAILED", "KILLED"), 60)
            wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")

    st = seen["shrunk"]
    directives = st.directives
    versions = [d.version for d in directives]
    assert versions == sorted(set(versions)), versions           # each acted on once, in order
    assert all(d.error == "" for d in directives), directives
    assert any("optimus" in d.reason for d in directives), directives
    grow = next(d for d in directives if d.workers + d.servers > 2)
    assert grow.workers <= 2 and grow.servers <= 2
    obj = [h.objective for h in st.objective_history]
    assert None not in obj, obj                                   # every objective finite
    assert obj[-1] < obj[0]                                       # trained on through both changes
