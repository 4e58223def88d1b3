"""The RM web UI's page of one node, `/cluster/node/{node_id}`: its report, containers and utilization."""
from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any, Optional

from .. import rest_views as views
from ..model import Node
from .format import fmt_age, fmt_mb
from .layout import app_link, escape, html_table, live_fields, page
from .utilization import utilization_charts

if TYPE_CHECKING:
    from ..context import RmContext

NODE_FIELDS = (
    ("Node", "id", "text"), ("Rack", "rack", "text"), ("State", "state", "state"),
    ("Host", "nodeHostName", "text"), ("HTTP address", "nodeHTTPAddress", "text"),
    ("Containers", "numContainers", "int"), ("Memory used", "usedMemoryMB", "mb"),
    ("Memory free", "availMemoryMB", "mb"), ("Memory total", "totalResource.memory", "mb"),
    ("VCores used", "usedVirtualCores", "int"), ("VCores free", "availableVirtualCores", "int"),
    ("Last heartbeat", "lastHeartbeat", "age"), ("Last health update", "lastHealthUpdate", "time"),
    ("Health", "healthReport", "text"), ("Version", "version", "text"),
)


def _containers(rm: "RmContext", node: Node, now_ms: float) -> str:
    rows = []
    for cid in sorted(node.containers):
        c = rm.core.containers.get(cid)
        if c is None:
            continue
        rows.append([escape(cid), app_link(c.app_id), "AM" if c.is_am else escape(c.tag or "-"),
                     escape(fmt_mb(c.resource.memory)), str(c.resource.vcores),
                     escape(fmt_age(c.allocated_at * 1000, now_ms))])
    return html_table(["Container", "Application", "Role", "Memory", "VCores", "Allocated"], rows)


def render_node_page(rm: "RmContext", node: Node, now_ms: float,
                     utilization: Optional[dict[str, Any]]) -> str:
    """One node's page."""
    src = f"/ws/v1/cluster/nodes/{urllib.parse.quote(node.node_id, safe='')}"
    body = (f"<h1>Node {escape(node.node_id)}</h1>"
            f'{live_fields("node", src, ["node"], NODE_FIELDS, views.node_json(node), now_ms)}'
            f"<h2>Containers</h2>{_containers(rm, node, now_ms)}"
            f"<h2>Utilization</h2>{utilization_charts(utilization, node.node_id)}")
    return page(f"Node {node.node_id}", body, active="/cluster/nodes")


def render_node_not_found(node_id: str) -> str:
    """The 404 page for a node the RM does not know."""
    return page("Node not found", f"<h1>Node not found</h1><p>The ResourceManager knows no node "
                                  f"<code>{escape(node_id)}</code>.</p>", active="/cluster/nodes")


__all__ = ["NODE_FIELDS", "render_node_not_found", "render_node_page"]
