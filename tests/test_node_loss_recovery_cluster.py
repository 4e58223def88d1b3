"""A PS job survives a crashed host: the NM and every container process on it SIGKILLed.

Four nodes; an MLR job (2 workers, 2 servers, checkpoints every 2 epochs, the exactly-once audit
on) trains with no epoch limit in reach. Once it has trained 3 epochs the test crashes a node that
hosts some of its executors but not its AM. The RM declares the node LOST after its expiry and
reports the containers -100 (ABORTED). What the AM does depends on what the node hosted: only
workers, and it replaces them on the surviving nodes and goes on from the clock they were lost in;
a server among them, and it replaces every executor and goes back to the latest checkpoint.
Checked either way: the job recovers once (the shape history names the executors lost with -100),
it trains two more epochs afterwards, none of its executors runs on the lost node, the epochs
form one contiguous run and the audit is exact. Then the test kills the job.
"""
from __future__ import annotations

import json
import os
import signal
import urllib.request
from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import get_app, pids_with_env, rest, running_cluster, submit_app, wait_app
from polling import wait_until
from protocol import container_env
from test_cluster_node_loss import remove_leftover_cgroups

pytestmark = pytest.mark.cluster


@pytest.fixture
def four_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Destructive: a cluster of its own. Each node takes two executors besides an AM.
    with running_cluster(tmp_path_factory.mktemp("node-loss-recovery"), nodes=4, node_memory_mb=1280,
                         node_vcores=3, am_expiry_s=15) as c:
        yield c


def am_status(cluster: Any, app_id: str) -> dict[str, Any] | None:
    try:
        url = get_app(cluster.rm_url, app_id)["trackingUrl"].rstrip("/")
        with urllib.request.urlopen(url + "/status", timeout=5) as r:
            return json.loads(r.read())
    except Exception:  # noqa: BLE001 - not up yet, or recovering
        return None


def test_a_crashed_host_costs_the_job_a_recovery_not_its_life(four_nodes) -> None:
    c = four_nodes
    app_id = submit_app(c.rm_url, build_ps_submission(
        {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 100_000, "convergence_threshold": 1e-12,
         "checkpoint_every_epochs": 2, "audit_updates": True, "executor_memory_mb": 320}, name="host-crash",
        am_memory=384))
    victim = None
    try:
        st = wait_until(lambda: (s := am_status(c, app_id)) and s["epoch"] >= 3 and s, 120, "three epochs")
        am_node = get_app(c.rm_url, app_id)["amHostHttpAddress"]
        executors = [e for e in st["shape"]["executors"] if e["state"] == "READY"]
        victim = next(n for n in c.nodes if n.http_address != am_node and
                      any(e["node"] == n.node_id for e in executors))
        doomed = [e for e in executors if e["node"] == victim.node_id]
        c.kill_node(victim.index)                                   # the host crashes: NM ...
        for e in doomed:                                            # ... and every container on it
            for pid in pids_with_env(container_env.CONTAINER_ID, e["container_id"]):
                os.kill(pid, signal.SIGKILL)

        st = wait_until(lambda: (s := am_status(c, app_id)) and s["recovery"]["recoveries"]
                        + s["recovery"]["replacements"] >= 1 and s, 120, "the job recovered")
        after = st["epoch"]
        st = wait_until(lambda: (s := am_status(c, app_id)) and s["epoch"] >= after + 2 and s, 120,
                        "two epochs after the recovery")
        rec = [h for h in st["shape_history"] if h["mode"] in ("recovery", "replace_worker")]
        assert len(rec) == 1 and rec[0]["error"] == "" and st["recovery"]["failures"] == 1, st["shape_history"]
        servers_lost = any(e["role"] == "server" for e in doomed)
        assert rec[0]["mode"] == ("recovery" if servers_lost else "replace_worker"), (doomed, rec[0])
        assert servers_lost or rec[0]["epochs_redone"] == 0, rec[0]
        assert any("exited with -100" in lost for lost in rec[0]["lost"]), rec[0]["lost"]
        assert {e["id"] for e in doomed} <= {lost.split(" ")[0] for lost in rec[0]["lost"]}, rec[0]["lost"]
        live = [e for e in st["shape"]["executors"] if e["state"] == "READY"]
        assert len(live) == 4 and all(e["node"] != victim.node_id for e in live), live
        assert [h["epoch"] for h in st["objective_history"]] == list(range(len(st["objective_history"])))
        assert st["eps"]["audit_mismatches"] == []
    finally:
        rest(c.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_app(c.rm_url, app_id, ("KILLED", "FINISHED", "FAILED"), 60)
        if victim is not None:
            c.stop()
            remove_leftover_cgroups(victim.node_id)
