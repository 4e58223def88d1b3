"""docs/metrics.md lists exactly the families both expositions write, and the Grafana dashboard
queries only those (so neither the page nor the dashboard goes stale when a metric changes)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from protocol import internal_api as api
from protocol.records import Resource
from rm import prometheus as rm_prometheus
from rm_testing import make_core, register

from nodemanager import prometheus as nm_prometheus
from prom_text import parse

DOCS = Path(__file__).resolve().parents[2] / "docs"


def documented() -> dict[str, str]:
    """Metric name -> its type, from the tables of docs/metrics.md."""
    rows = re.findall(r"^\| `(elastane_[a-z_]+)` \| (gauge|counter) \|", (DOCS / "metrics.md").read_text(), re.M)
    return dict(rows)


def exposed() -> dict[str, str]:
    core = make_core()
    register(core, "n:1")
    rm = parse(rm_prometheus.render(core))
    nm = parse(nm_prometheus.render("n:1", Resource(1024, 2), Resource(0, 0), 0, api.NodeUtilization(), 0.0))
    return {f.name: f.type for f in [*rm.values(), *nm.values()]}


def test_docs_list_every_metric_with_its_type() -> None:
    assert documented() == exposed()


def test_dashboard_is_grafana_json_over_documented_metrics() -> None:
    dash = json.loads((DOCS / "grafana" / "elastane-dashboard.json").read_text())
    assert dash["uid"] and dash["schemaVersion"] >= 36 and dash["panels"]
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    used = {m for e in exprs for m in re.findall(r"elastane_[a-z_]+", e)}
    docs = documented()
    assert used and used <= set(docs), used - set(docs)
    # The dashboard covers the utilization the issue asks for: cluster, per node, per app and role.
    for name in ("elastane_rm_cluster_cpu_cores", "elastane_rm_node_cpu_cores", "elastane_rm_node_memory_bytes",
                 "elastane_rm_cluster_network_receive_bytes_per_second", "elastane_rm_app_cpu_cores",
                 "elastane_rm_container_cpu_cores"):
        assert name in used, name
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
