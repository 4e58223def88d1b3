"""Graceful decommission end to end: `elastane node decommission` on a node running a container;
the next app's container goes to the other node; once the first container ends, the node is
DECOMMISSIONED and its NodeManager stops by itself; `elastane node recommission` forgets it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from appmaster.distributed_shell import build_submission
from appmaster.ps.submission import build_ps_submission
from conftest import get_app, rest, running_cluster, submit_app, wait_app
from elastane_cli import processes
from polling import wait_until
from protocol.ps_status import PsStatus, decode_status


def elastane(rm: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ELASTANE_RM"}
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", "--rm", rm, *args, "--user", "root"],
                          capture_output=True, text=True, timeout=60, env=env)


def status(url: str) -> PsStatus | None:
    """The PS AM's /status (None while it does not answer)."""
    try:
        return decode_status(rest(url, "GET", "/status"))
    except OSError:
        return None


def nodes(rm_url: str) -> dict[str, dict[str, object]]:
    q = "?states=NEW,RUNNING,UNHEALTHY,DECOMMISSIONING,DECOMMISSIONED,LOST,REBOOTED,SHUTDOWN"
    return {n["id"]: n for n in (rest(rm_url, "GET", "/ws/v1/cluster/nodes" + q).get("nodes") or {}).get("node") or []}


def test_a_decommissioned_node_drains_then_its_nm_stops_and_recommission_forgets_it(tmp_path: Path) -> None:
    hold = ["sh", "-c", f"echo $NM_HTTP_ADDRESS > {tmp_path}/$CONTAINER_ID.node; "
                        f"while [ ! -e {tmp_path}/release ]; do sleep 0.1; done"]
    with running_cluster(tmp_path / "c", nodes=2, node_memory_mb=1024, node_vcores=4) as c:
        # AM 256 MB and a 700 MB container: they cannot share a 1024 MB node.
        first = submit_app(c.rm_url, build_submission("drains", hold, 1, 700, 1, am_memory=256))
        marks = wait_until(lambda: (fs := list(tmp_path.glob("*.node"))) and all(f.read_text().strip() for f in fs)
                           and fs, 60, "the first app's container running")
        where = marks[0].read_text().strip()
        victim = next(n for n in c.nodes if n.http_address == where)
        out = elastane(c.rm_url, "node", "decommission", victim.node_id)
        assert out.returncode == 0, out.stderr
        assert "DECOMMISSIONING" in out.stdout, out.stdout
        assert nodes(c.rm_url)[victim.node_id]["state"] == "DECOMMISSIONING"
        # While it drains, a new container cannot go there (and does not fit beside the AM).
        (tmp_path / "second").mkdir()
        say = ["sh", "-c", f"echo $NM_HTTP_ADDRESS > {tmp_path}/second/node"]
        second = submit_app(c.rm_url, build_submission("elsewhere", say, 1, 128, 1, am_memory=128))
        assert wait_app(c.rm_url, second, ("FINISHED",), 60)["finalStatus"] == "SUCCEEDED"
        assert (tmp_path / "second" / "node").read_text().strip() != where
        (tmp_path / "release").touch()
        assert wait_app(c.rm_url, first, ("FINISHED",), 60)["finalStatus"] == "SUCCEEDED"
        wait_until(lambda: nodes(c.rm_url)[victim.node_id]["state"] == "DECOMMISSIONED", 30, "DECOMMISSIONED")
        assert not processes.wait_gone([(victim.pid, victim.start_ticks)], 30.0), "the NM did not stop by itself"
        bad = elastane(c.rm_url, "node", "decommission", "nowhere:1")
        assert bad.returncode != 0 and "nowhere:1" in bad.stderr
        out = elastane(c.rm_url, "node", "recommission", victim.node_id)
        assert out.returncode == 0 and "may register again" in out.stdout, (out.stdout, out.stderr)
        assert victim.node_id not in nodes(c.rm_url)


def test_a_ps_jobs_executors_move_off_a_draining_node_and_the_job_trains_every_epoch(tmp_path: Path) -> None:
    """The elastic part: the job's executors on the draining node are moved (EPS, no restart) to
    the other nodes, the node is DECOMMISSIONED and its NM stops while the job still trains, and the
    job ends SUCCEEDED with every epoch of its history, in its first attempt."""
    with running_cluster(tmp_path / "c", nodes=3, node_memory_mb=2048, node_vcores=5) as c:
        a, b = c.nodes[0], c.nodes[1]
        spec: dict[str, Any] = {
            "app": "mlr", "workers": 2, "servers": 2, "max_epochs": 100, "convergence_threshold": 1e-9,
            "executor_memory_mb": 320, "data": {"num_samples": 16000, "seed": 7},
            "placement": [{"node": a.node_id, "workers": 1, "servers": 1},
                          {"node": b.node_id, "workers": 1, "servers": 1}]}
        sub = build_ps_submission(spec, name="drained", am_memory=384)
        app_id = submit_app(c.rm_url, sub)
        wait_until(lambda: (x := get_app(c.rm_url, app_id))["state"] == "RUNNING" and x.get("trackingUrl"), 90,
                   "the AM's tracking URL")
        app = get_app(c.rm_url, app_id)
        url = str(app["trackingUrl"]).rstrip("/")
        victim = b if app["amHostHttpAddress"] != b.http_address else a      # a node with executors, not the AM
        wait_until(lambda: (st := status(url)) is not None and len(st.objective_history) >= 2, 120, "two epochs")
        out = elastane(c.rm_url, "node", "decommission", victim.node_id)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: nodes(c.rm_url)[victim.node_id]["state"] == "DECOMMISSIONED", 120,
                   f"{victim.node_id} drained by the job's moves")
        assert not processes.wait_gone([(victim.pid, victim.start_ticks)], 30.0), "the NM did not stop by itself"
        st = status(url)
        assert st is not None and len(st.objective_history) < spec["max_epochs"], "the job ended before the move"
        done = wait_app(c.rm_url, app_id, ("FINISHED",), 300)
        assert done["finalStatus"] == "SUCCEEDED", done["diagnostics"]
        attempts = rest(c.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/appattempts")["appAttempts"]["appAttempt"]
        assert len(attempts) == 1
        shape = rest(c.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/shape")["shape"]
        assert any("decommissioning" in d["reason"] for d in shape["decisions"]), shape["decisions"]
