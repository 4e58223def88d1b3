"""Placement is obeyed: a shape directive that names nodes moves a running PS job there.

Four nodes; an MLR job (2 workers, 2 servers, EPS mode, the exactly-once audit on) trains with no
epoch limit in reach. The owner directs it (`PUT /ws/v1/cluster/apps/{id}/shape`, the same
ShapeDirective a policy sends) first onto nodes {A, B}, then onto {C, D}; the RM spreads the shape
over them, one worker + one server per node (`JobDecision.spread`). Each time the AM asks for
containers on exactly the nodes short of their count (locality not relaxed), moves the model
blocks and input splits of every executor elsewhere (or surplus on its node) onto the newcomers,
and retires the old ones. The first directive matters even when the first-fit executors already
sit on {A, B}: two servers on A and two workers on B are on the named nodes but not placed as
told. Checked: after each directive each named node runs exactly one worker and one server and
no other node runs any, the shape is unchanged, training went
on (more epochs, objective still falling, no epoch skipped), and the servers applied every
mini-batch the workers ran exactly once across the moves. Then the test kills the job.

A job spec's `placement` puts a job's first executors exactly where it says: an MLR job submitted
with one worker and one server on each of two nodes (the layout bench/harmony_colocation.py gives
its static jobs) is given exactly four executors (none retired, so none started elsewhere first),
one worker and one server on each node, and an empty shape history (no reshape moved them there).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import am_status, pids_with_env, rest, running_cluster, submit_app, wait_app
from protocol.ps_status import PsStatus
from protocol.shape_history import EpsChange
from polling import wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Room for the job's four executors twice on two nodes (old and new side by side) plus its AM.
    with running_cluster(tmp_path_factory.mktemp("placement"), nodes=4, node_memory_mb=2048,
                         node_vcores=6) as c:
        yield c


def live_nodes(status: PsStatus) -> dict[str, str]:
    """executor id -> node of every executor still in the job."""
    assert status.shape is not None
    return {e.id: e.node for e in status.shape.executors if e.state in ("LAUNCHING", "READY")}


def directed(cluster: Any, app_id: str, version: int, nodes: list[str]) -> PsStatus | None:
    """The AM's status once it has carried out directive `version` and every executor is on `nodes`."""
    st = am_status(cluster, app_id)
    if st is None:
        return None
    outcomes = [d for d in st.directives if d.version == version]
    if not outcomes:
        return None
    assert outcomes[-1].error == "", outcomes[-1]
    # Placement retires what ran elsewhere only once the newcomers serve: placed as told = done.
    return st if roles_per_node(st) == {n: ["server", "worker"] for n in nodes} else None


def roles_per_node(status: PsStatus) -> dict[str, list[str]]:
    """node -> the roles of the job's live executors there, sorted."""
    out: dict[str, list[str]] = {}
    for executor_id, node in live_nodes(status).items():
        out.setdefault(node, []).append(executor_id.split("-")[0])
    return {n: sorted(r) for n, r in out.items()}


def test_a_directive_moves_a_running_job_onto_the_named_nodes(four_nodes) -> None:
    cluster = four_nodes
    nodes = sorted(n["id"] for n in rest(cluster.rm_url, "GET", "/ws/v1/cluster/nodes")["nodes"]["node"])
    assert len(nodes) == 4
    app_id = submit_app(cluster.rm_url, build_ps_submission(
        {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 100_000, "convergence_threshold": 1e-12,
         "audit_updates": True, "executor_memory_mb": 320}, name="placed", am_memory=384))
    try:
        first = wait_until(lambda: (s := am_status(cluster, app_id)) and (s.epoch or 0) >= 1 and s, 120,
                           "the job trains")
        initial = first.initial_objective
        assert initial is not None
        history = [(nodes[:2], 1), (nodes[2:], 2)]
        for target, version in history:
            before = wait_until(lambda: am_status(cluster, app_id), 30, "the AM answers")
            rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/shape",
                 {"workers": 2, "servers": 2, "nodes": target}, user="alice")
            st = wait_until(lambda: directed(cluster, app_id, version, target), 180,
                            f"one worker + one server on each of {target} after directive v{version}")
            live = live_nodes(st)
            assert sorted(k.split("-")[0] for k in live) == ["server", "server", "worker", "worker"], live
            # Training goes on after the move: more epochs on the new nodes, none skipped.
            moved_at = st.epoch or 0
            st = wait_until(lambda: (s := am_status(cluster, app_id)) and (s.epoch or 0) >= moved_at + 2 and s, 120,
                            f"two more epochs after directive v{version}")
            assert (st.epoch or 0) > (before.epoch or 0)
            epochs = [h.epoch for h in st.objective_history]
            assert epochs == list(range(len(epochs)))
            last = st.objective_history[-1].objective
            assert last is not None and last < initial
            # Exactly-once is the AM's audit at every epoch's end (no mismatch: all mini-batches run
            # by then were applied once). This job is still training, so a status read after a clock
            # of the next epoch counts that clock's runs, which its epoch-end audit has not read yet.
            assert st.eps is not None and st.eps.audit_mismatches == []
            assert 0 < st.eps.minibatches_applied <= st.eps.minibatches_run
        relocations = [h for h in st.shape_history if isinstance(h, EpsChange) and h.op.startswith("place_")]
        assert relocations and all(h.error == "" for h in relocations), st.shape_history
        # The RM shows the directive as delivered.
        shape = rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/shape")["shape"]
        assert shape["directive"]["nodes"] == nodes[2:] and shape["directiveDelivered"]
    finally:
        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_app(cluster.rm_url, app_id, ("KILLED", "FINISHED", "FAILED"), 60)
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")


def test_the_first_executors_start_on_the_nodes_the_spec_places_them(four_nodes) -> None:
    cluster = four_nodes
    nodes = sorted(n["id"] for n in rest(cluster.rm_url, "GET", "/ws/v1/cluster/nodes")["nodes"]["node"])[:2]
    placement = [{"node": n, "workers": 1, "servers": 1} for n in nodes]
    app_id = submit_app(cluster.rm_url, build_ps_submission(
        {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 100_000, "convergence_threshold": 1e-12,
         "executor_memory_mb": 320, "placement": placement}, name="placed-at-start", am_memory=384))
    try:
        st = wait_until(lambda: (s := am_status(cluster, app_id)) and (s.epoch or 0) >= 1 and s, 120,
                        "the job trains")
        assert st.shape is not None and st.spec is not None
        executors = st.shape.executors
        assert all(e.state == "READY" for e in executors), executors
        on = Counter((e.id.split("-")[0], e.node) for e in executors)
        assert on == Counter({(role, n): 1 for role in ("worker", "server") for n in nodes}), executors
        assert st.shape_history == [], st.shape_history
        assert [(p.node, p.workers, p.servers) for p in st.spec.placement] == \
            [(p["node"], p["workers"], p["servers"]) for p in placement]
    finally:
        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_app(cluster.rm_url, app_id, ("KILLED", "FINISHED", "FAILED"), 60)
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
