"""On a real localhost cluster: while a container burns CPU and holds spilled bytes, the NMs'
measurements reach the RM's utilization series, node and app JSON, and both expositions."""
from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from appmaster.distributed_shell import build_submission
from conftest import rest, submit_app, wait_app
from polling import wait_until
from prom_text import parse

pytestmark = pytest.mark.cluster

SPILLED = 5000


def burning_node(cluster: Any) -> dict[str, Any] | None:
    """The RM's node entry whose latest report shows the burner: CPU in use and its spill file."""
    nodes = rest(cluster.rm_url, "GET", "/ws/v1/cluster/nodes")["nodes"]["node"]
    for n in nodes:
        ru = n.get("resourceUtilization")
        if ru and ru["spillBytes"] >= SPILLED and ru["containersCPUUsage"] > 0.05:
            return n
    return None


def test_utilization_fills_with_real_numbers_while_a_container_burns_cpu(cluster):
    cmd = ["sh", "-c", f"mkdir -p spill && head -c {SPILLED} /dev/zero > spill/b0.lz4; while :; do :; done"]
    app_id = submit_app(cluster.rm_url, build_submission("burn", cmd, 1, 128, 1))
    try:
        wait_app(cluster.rm_url, app_id, ("RUNNING",), 60)
        node = wait_until(lambda: burning_node(cluster), 60, "a node reporting the burning container")
        nid = node["id"]
        out = rest(cluster.rm_url, "GET", f"/ws/v1/cluster/utilization?node={nid}")["utilization"]
        series = out["nodes"][nid]
        assert any(p["cpuCores"] > 0.05 for p in series) and all(p["memoryMB"] >= 0 for p in series)
        assert series[-1]["memoryMB"] > 0 and series[-1]["spillBytes"] >= SPILLED
        last = out["cluster"][-1]
        assert last["cpuCores"] > 0 and last["memoryMB"] > 0 and last["vcoresTotal"] == 6
        assert last["memoryTotalMB"] == 3 * 1024 and last["hostMemoryMB"] > 0
        # The app's sum follows the nodes' reports that name its containers, which can come a heartbeat
        # after the node's own figures.
        use = wait_until(lambda: rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}")["app"]
                         .get("resourceUtilization"), 30, "the app's resourceUtilization")
        assert use["containers"] >= 1 and use["memoryMB"] > 0
        # The same container in the NM's own exposition and in the RM's, with its labels.
        with urllib.request.urlopen(f"http://{node['nodeHTTPAddress']}/metrics/prometheus", timeout=10) as r:
            nm = parse(r.read().decode())
        burners = [(ls, v) for ls, v in nm["elastane_nm_container_spill_bytes"].samples if v >= SPILLED]
        assert len(burners) == 1 and burners[0][0]["app"] == app_id and burners[0][0]["node"] == nid
        with urllib.request.urlopen(cluster.rm_url + "/metrics/prometheus", timeout=10) as r:
            rm = parse(r.read().decode())
        assert rm["elastane_rm_node_cpu_cores"].value(node=nid) > 0
        # The AM container carries the role its launcher set.
        assert rm["elastane_rm_container_memory_bytes"].value(app=app_id, role="am", queue="default") > 0
    finally:
        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_app(cluster.rm_url, app_id, ("KILLED",), 60)
