"""End to end, destructive (own cluster): an NM SIGKILLed mid-app is LOST at the RM and the AM is
told its container ended with -100, which the distributed shell's diagnostics name."""
from pathlib import Path

import pytest

from appmaster.distributed_shell import build_submission
from conftest import rest, submit_app, wait_app
from polling import wait_until

pytestmark = pytest.mark.cluster


def node_states(cluster) -> dict[str, str]:
    out = {}
    for q in ("", "?states=NEW,RUNNING,UNHEALTHY,DECOMMISSIONED,LOST,REBOOTED,SHUTDOWN"):
        nodes = (rest(cluster.rm_url, "GET", "/ws/v1/cluster/nodes" + q).get("nodes") or {}).get("node") or []
        out.update({n["id"]: n["state"] for n in nodes})
    return out


def remove_leftover_cgroups(node_id: str) -> None:
    """A SIGKILLed NM cannot remove its containers' cgroups and the cluster's reaper only kills
    processes, so remove the (by now empty) per-node cgroup dirs here; rmdir refuses non-empty ones."""
    name = node_id.replace(":", "_")
    for node_dir in Path("/sys/fs/cgroup").glob(f"*/elastane/{name}"):
        for d in sorted((p for p in node_dir.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            node_dir.rmdir()
        except OSError:
            pass


def test_nm_killed_mid_app_is_lost_and_the_am_sees_100(private_cluster, tmp_path):
    c = private_cluster
    # AM 256 MB; two 800 MB containers cannot share a 1024 MB node nor the AM's node, so they land
    # on the two other nodes, one each: killing one of those never kills the AM.
    cmd = ["sh", "-c", f"echo $NM_HTTP_ADDRESS > {tmp_path}/$CONTAINER_ID.node; "
                       f"while [ ! -e {tmp_path}/release ]; do sleep 0.1; done"]
    sub = build_submission("node-loss", cmd, 2, 800, 1, am_memory=256)
    app_id = submit_app(c.rm_url, sub)
    wait_app(c.rm_url, app_id, ("RUNNING",), 60)
    files = wait_until(lambda: (fs := list(tmp_path.glob("*.node"))) and len(fs) == 2 and
                       all(f.read_text().strip() for f in fs) and fs, 60, "both containers running")
    where = {f.stem: f.read_text().strip() for f in files}
    am_node = rest(c.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}")["app"].get("amHostHttpAddress", "")
    victim_cid, victim_addr = sorted(where.items())[0]
    assert victim_addr != am_node and len(set(where.values())) == 2, (where, am_node)
    victim = next(n for n in c.nodes if n.http_address == victim_addr)

    try:
        _lose_node_and_check(c, app_id, victim, victim_cid, where, tmp_path)
    finally:
        c.stop()
        remove_leftover_cgroups(victim.node_id)


def _lose_node_and_check(c, app_id, victim, victim_cid, where, tmp_path) -> None:
    c.kill_node(victim.index)
    wait_until(lambda: node_states(c).get(victim.node_id) == "LOST", 30, f"{victim.node_id} LOST")
    running = [nid for nid, st in node_states(c).items() if st == "RUNNING"]
    assert victim.node_id not in running and len(running) == 2

    (tmp_path / "release").touch()     # let the surviving container exit 0
    app = wait_app(c.rm_url, app_id, ("FINISHED",), 60)
    assert app["finalStatus"] == "FAILED"
    assert f"{victim_cid} exited with -100 (ABORTED)" in app["diagnostics"], app["diagnostics"]
    survivor = next(cid for cid in where if cid != victim_cid)
    assert survivor not in app["diagnostics"]
