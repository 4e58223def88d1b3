"""Node health end to end (nodemanager/node_health.py, rm/nodes.py): an NM whose health script
prints ERROR is UNHEALTHY at the RM with the script's report, and no container is placed on it;
once the script is happy again the node is RUNNING and the waiting app runs."""
from __future__ import annotations

import urllib.request
from pathlib import Path

from conftest import rest, running_cluster, submit_app, wait_app
from appmaster.distributed_shell import build_submission
from polling import wait_until


def nm_heartbeats(rm_url: str) -> int:
    with urllib.request.urlopen(rm_url + "/metrics/prometheus", timeout=5) as r:
        text = r.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("elastane_rm_nm_heartbeats_total"))


def node(rm_url: str) -> dict[str, str]:
    q = "?states=NEW,RUNNING,UNHEALTHY,DECOMMISSIONED,LOST,REBOOTED,SHUTDOWN"
    [n] = (rest(rm_url, "GET", "/ws/v1/cluster/nodes" + q).get("nodes") or {}).get("node") or []
    return n  # type: ignore[no-any-return]


def test_an_unhealthy_node_gets_no_containers_until_its_script_is_happy_again(tmp_path: Path) -> None:
    flag = tmp_path / "broken"
    script = tmp_path / "health.sh"
    script.write_text(f"#!/bin/sh\n[ -e {flag} ] && echo 'ERROR: the disk controller resets'\nexit 0\n")
    script.chmod(0o755)
    nm_toml = tmp_path / "nm.toml"
    nm_toml.write_text(f'[nm]\nhealth_script = "{script}"\nhealth_check_interval_s = 0.2\n')
    with running_cluster(tmp_path / "c", nodes=1, extra_nm_args=["--config", str(nm_toml)]) as c:
        assert node(c.rm_url)["state"] == "RUNNING"
        flag.write_text("")
        wait_until(lambda: node(c.rm_url)["state"] == "UNHEALTHY", 30, "the node UNHEALTHY")
        assert node(c.rm_url)["healthReport"] == "health script: ERROR: the disk controller resets"
        app_id = submit_app(c.rm_url, build_submission("waits-for-health", ["true"], 1, 128, 1, am_memory=128))
        seen = nm_heartbeats(c.rm_url)
        wait_until(lambda: nm_heartbeats(c.rm_url) >= seen + 5, 30, "five more heartbeats")
        assert rest(c.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}")["app"]["state"] == "ACCEPTED"
        assert node(c.rm_url)["numContainers"] == 0
        flag.unlink()
        wait_until(lambda: node(c.rm_url)["state"] == "RUNNING", 30, "the node RUNNING again")
        assert node(c.rm_url)["healthReport"] == ""
        assert wait_app(c.rm_url, app_id, ("FINISHED",), 60)["finalStatus"] == "SUCCEEDED"
