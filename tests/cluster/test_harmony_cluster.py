"""Harmony on a real localhost cluster (RM with `--policy harmony` + 3 NMs as processes, each NM
running the arbiter): three PS jobs of different apps are profiled one per node, grouped, run
co-located with their COMP / COMM subtasks interleaved by each node's arbiter, and all finish.

Checked: every job SUCCEEDED; jobs shared a group at some point (their directives name the same
group); each move or pause kept the objective trajectory (the restored objective is the one at the
cut); some node's arbiter gave COMP slots to more than one job, interleaved, and no arbiter's grant
log holds more COMP threads at once than its CPU pool; no process of the jobs is left."""
from __future__ import annotations

import json
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import pids_with_env, rest, running_cluster, submit_app, wait_app
from nodemanager.arbiter import GrantRecord, cpu_oversubscribed
from polling import wait_until
from ps_am_status import final_status
from protocol import container_env

pytestmark = pytest.mark.cluster

# Data sized so an epoch takes a good part of a second: the policy (a round a second) profiles and
# groups the jobs while they still have most of their epochs to go, on a fast host too.
JOBS = [("mlr", {"num_samples": 30_000}), ("nmf", {"num_users": 6000}), ("lda", {"num_docs": 3000})]


def _arbiter_view(http_address: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http_address}/ws/v1/node/arbiter?limit=1000000", timeout=10) as r:
        view: dict[str, Any] = json.loads(r.read())["arbiter"]
        return view


def _record(g: dict[str, Any]) -> GrantRecord:
    return GrantRecord(role=g["role"], job=int(g["job"], 16), executor=int(g["executor"], 16),
                       request_id=g["request_id"], asked_at=g["asked_at"], granted_at=g["granted_at"],
                       released_at=g["released_at"], promoted_at=g["promoted_at"], reclaimed=g["reclaimed"],
                       threads=g["threads"])


@pytest.mark.timeout(900)     # 81 s in a quiet CI, 145-175 s alone on a slower machine: 300 s was too near
def test_three_jobs_are_profiled_grouped_interleaved_and_finish(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", nodes=3, node_memory_mb=2048, node_vcores=8, policy="harmony",
                         am_expiry_s=30, nm_expiry_s=30) as cluster:
        apps = []
        for app, data in JOBS:
            spec = {"app": app, "workers": 1, "servers": 1, "max_epochs": 40, "convergence_threshold": 1e-12,
                    "executor_memory_mb": 256, "data": data}
            apps.append(submit_app(cluster.rm_url, build_ps_submission(spec, name=f"harmony-{app}", am_memory=256)))
        finals = [wait_app(cluster.rm_url, a, ("FINISHED", "FAILED", "KILLED"), 600) for a in apps]
        nodes = rest(cluster.rm_url, "GET", "/ws/v1/cluster/nodes")["nodes"]["node"]
        views = {n["id"]: _arbiter_view(n["nodeHTTPAddress"]) for n in nodes}
        statuses = [final_status(cluster, a) for a in apps]
        for a in apps:
            wait_until(lambda a=a: not pids_with_env(container_env.APP_ID, a), 30, f"every process of {a} gone")

    for app in finals:
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    # Jobs were grouped together: some group named in the directives of two or more of them.
    members: dict[str, set[str]] = defaultdict(set)
    for a, st in zip(apps, statuses):
        for d in st.directives:
            if d.group:
                members[d.group].add(a)
    assert any(len(m) >= 2 for m in members.values()), members
    # Every pause / resume (a move by restart is both) continued the objective trajectory.
    for st in statuses:
        for h in st.suspension.history:
            assert h.ok
            if h.op == "resume" and h.objective_before is not None:
                assert h.objective_restored == pytest.approx(h.objective_before, rel=1e-3), h
    # The arbiters never let COMPs hold more threads than their pool (in the bounded grant log) and
    # interleaved co-located jobs' COMP subtasks (cumulative counters: on a fast host the last job
    # alone fills the log's tail).
    for node, view in views.items():
        assert cpu_oversubscribed([_record(g) for g in view["grantLog"]], view["cpu_pool"]) == [], node
    interleaved = {n: v["cpu_interleavings"] for n, v in views.items()}
    assert any(len(v["cpu_grants_by_job"]) >= 2 for v in views.values()), interleaved
    assert max(interleaved.values()) >= 1, ({n: v["cpu_grants_by_job"] for n, v in views.items()},
                                            [st.directives for st in statuses])
