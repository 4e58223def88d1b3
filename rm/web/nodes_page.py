"""The RM web UI's node list, `/cluster/nodes`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import rest_views as views
from .layout import Column, live_table, page

if TYPE_CHECKING:
    from ..context import RmContext

NODES = "/ws/v1/cluster/nodes"

NODE_COLUMNS = (
    Column("Node", "id", "node"), Column("Rack", "rack"), Column("State", "state", "state"),
    Column("HTTP address", "nodeHTTPAddress"), Column("Containers", "numContainers", "int"),
    Column("Memory used", "usedMemoryMB", "mb"), Column("Memory free", "availMemoryMB", "mb"),
    Column("VCores used", "usedVirtualCores", "int"), Column("VCores free", "availableVirtualCores", "int"),
    Column("Last heartbeat", "lastHeartbeat", "age"), Column("Health", "healthReport"),
)


def nodes_table(rm: "RmContext", now_ms: float, css_id: str = "nodes") -> str:
    """The live table of every node the RM knows."""
    nodes = [views.node_json(n) for n in rm.core.nodes]
    return live_table(css_id, NODES, ["nodes", "node"], NODE_COLUMNS, nodes, now_ms, sort_key="id", empty="no nodes")


def render_nodes_page(rm: "RmContext", now_ms: float) -> str:
    """Every node the RM knows, live."""
    return page("Nodes", f"<h1>Nodes</h1>{nodes_table(rm, now_ms)}", active="/cluster/nodes")


__all__ = ["NODE_COLUMNS", "nodes_table", "render_nodes_page"]
