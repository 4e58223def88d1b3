"""A PS job spec's `placement` puts the job's first executors exactly where it says.

Two nodes; an MLR job (2 workers, 2 servers) is submitted with a placement of one worker and one
server on each node, the layout bench/harmony_colocation.py gives its static jobs. Checked from the
AM's status once it trains: the job was given exactly four executors (none retired, so none
started elsewhere first), one worker and one server on each node, and its shape history is empty
(no reshape moved them there). Then the test kills the job.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import am_status, pids_with_env, rest, running_cluster, submit_app, wait_app
from polling import wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Room on either node for the AM next to the worker and the server placed there.
    with running_cluster(tmp_path_factory.mktemp("initial-placement"), nodes=2, node_memory_mb=2048,
                         node_vcores=4) as c:
        yield c


def test_the_first_executors_start_on_the_nodes_the_spec_places_them(two_nodes) -> None:
    cluster = two_nodes
    nodes = sorted(n["id"] for n in rest(cluster.rm_url, "GET", "/ws/v1/cluster/nodes")["nodes"]["node"])
    assert len(nodes) == 2
    placement = [{"node": n, "workers": 1, "servers": 1} for n in nodes]
    app_id = submit_app(cluster.rm_url, build_ps_submission(
        {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 100_000, "convergence_threshold": 1e-12,
         "executor_memory_mb": 320, "placement": placement}, name="placed-at-start", am_memory=384))
    try:
        st = wait_until(lambda: (s := am_status(cluster, app_id)) and s["epoch"] >= 1 and s, 120,
                        "the job trains")
        executors = st["shape"]["executors"]
        assert all(e["state"] == "READY" for e in executors), executors
        on = Counter((e["id"].split("-")[0], e["node"]) for e in executors)
        assert on == Counter({(role, n): 1 for role in ("worker", "server") for n in nodes}), executors
        assert st["shape_history"] == [], st["shape_history"]
        assert st["spec"]["placement"] == placement
    finally:
        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_app(cluster.rm_url, app_id, ("KILLED", "FINISHED", "FAILED"), 60)
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
