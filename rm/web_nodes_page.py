"""The RM web UI's node list, `/cluster/nodes`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import rest_views as views
from .web_layout import Column, live_table, page

if TYPE_CHECKING:
    from .server import ResourceManagerServer

NODES = "/ws/v1/cluster/nodes"

NODE_COLUMNS = (
    Column("Node", "id", "node"), Column("Rack", "rack"), Column("State", "state", "state"),
    Column("HTTP address", "nodeHTTPAddress"), Column("Containers", "numContainers", "int"),
    Column("Memory used", "usedMemoryMB", "mb"), Column("Memory free", "availMemoryMB", "mb"),
    Column("VCores used", "usedVirtualCores", "int"), Column("VCores free", "availableVirtualCores", "int"),
    Column("Last heartbeat", "lastHeartbeat", "age"), Column("Health", "healthReport"),
)


def render_nodes_page(rm: "ResourceManagerServer", now_ms: float) -> str:
    """Every node the RM knows, live."""
    nodes = [views.node_json(n) for n in rm.core.nodes]
    table = live_table("nodes", NODES, ["nodes", "node"], NODE_COLUMNS, nodes, now_ms, sort_key="id",
                       empty="no nodes")
    return page("Nodes", f"<h1>Nodes</h1>{table}", active="/cluster/nodes")


__all__ = ["NODE_COLUMNS", "render_nodes_page"]
