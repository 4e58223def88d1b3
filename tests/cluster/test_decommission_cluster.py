"""Graceful decommission end to end: `elastane node decommission` on a node running a container;
the next app's container goes to the other node; once the first container ends, the node is
DECOMMISSIONED and its NodeManager stops by itself; `elastane node recommission` forgets it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from appmaster.distributed_shell import build_submission
from conftest import rest, running_cluster, submit_app, wait_app
from elastane_cli import processes
from polling import wait_until


def elastane(rm: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ELASTANE_RM"}
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", "--rm", rm, *args, "--user", "root"],
                          capture_output=True, text=True, timeout=60, env=env)


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
