"""The RM web UI's overview, `/cluster`: cluster metrics, utilization charts, running apps, nodes."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from protocol.records import AppState

from .. import rest_views as views
from .apps_page import apps_table
from .format import fmt_time
from .layout import escape, live_fields, page
from .nodes_page import nodes_table
from .utilization import utilization_charts

if TYPE_CHECKING:
    from ..context import RmContext

METRICS = "/ws/v1/cluster/metrics"

APP_FIELDS = (("Submitted", "appsSubmitted", "int"), ("Running", "appsRunning", "int"),
              ("Pending", "appsPending", "int"), ("Completed", "appsCompleted", "int"),
              ("Failed", "appsFailed", "int"), ("Killed", "appsKilled", "int"))
RESOURCE_FIELDS = (("Memory used", "allocatedMB", "mb"), ("Memory total", "totalMB", "mb"),
                   ("VCores used", "allocatedVirtualCores", "int"), ("VCores total", "totalVirtualCores", "int"),
                   ("Containers", "containersAllocated", "int"), ("Containers pending", "containersPending", "int"))
NODE_FIELDS = (("Active", "activeNodes", "int"), ("Lost", "lostNodes", "int"),
               ("Unhealthy", "unhealthyNodes", "int"), ("Decommissioned", "decommissionedNodes", "int"))


def render_overview_page(rm: "RmContext", now_ms: float, utilization: Optional[dict[str, Any]]) -> str:
    """The cluster overview page (utilization: the RM series' JSON)."""
    core = rm.core
    metrics = views.cluster_metrics(core)
    path = ["clusterMetrics"]
    ha = rm.ha_info     # an HA RM: which one this is, and that it is the active one (a standby redirects here)
    ha_note = (f"&middot; <b>{escape(ha.get('haRmId', ''))}</b>, the active ResourceManager "
               f"(epoch {escape(ha.get('haEpoch', ''))}) " if ha else "")
    body = (f"<h1>Cluster overview</h1><p>ResourceManager started {escape(fmt_time(core.start_time * 1000))} "
            f"{ha_note}&middot; policy <b>{escape(core.cfg.policy)}</b> &middot; "
            f'<a href="/cluster/scheduler">scheduler</a></p>'
            f'<div class="charts"><div><h2><a href="/cluster/apps">Applications</a></h2>'
            f'{live_fields("metrics-apps", METRICS, path, APP_FIELDS, metrics["clusterMetrics"], now_ms)}</div>'
            f'<div><h2>Resources</h2>'
            f'{live_fields("metrics-resources", METRICS, path, RESOURCE_FIELDS, metrics["clusterMetrics"], now_ms)}'
            f'</div><div><h2><a href="/cluster/nodes">Nodes</a></h2>'
            f'{live_fields("metrics-nodes", METRICS, path, NODE_FIELDS, metrics["clusterMetrics"], now_ms)}</div></div>'
            f"<h2>Cluster utilization</h2>{utilization_charts(utilization)}"
            f"<h2>Running applications</h2>{apps_table(rm, now_ms, AppState.RUNNING, css_id='running-apps')}"
            f"<h2>Nodes</h2>{nodes_table(rm, now_ms, css_id='overview-nodes')}")
    return page("Elastane ResourceManager", body, active="/cluster")


__all__ = ["render_overview_page"]
