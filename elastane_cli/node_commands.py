"""`elastane node list`: the cluster's nodes from the RM's /ws/v1/cluster/nodes."""
from __future__ import annotations

import argparse
import asyncio

from protocol.yarn_views import NodeView

from .context import CliContext
from .errors import EXIT_OK
from .rm_rest_client import RmRestClient
from .tables import format_age, render_table

NODE_HEADERS = ["NODE-ID", "STATE", "HTTP-ADDRESS", "CONTAINERS", "MEM-USED/TOTAL(MB)",
                "VCORES-USED/TOTAL", "LAST-HEARTBEAT"]


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    node = sub.add_parser("node", help="the cluster's nodes")
    acts = node.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = acts.add_parser("list", parents=[common], help="table of nodes")
    p.add_argument("--all", action="store_true", help="include LOST / DECOMMISSIONED / SHUTDOWN nodes")
    p.set_defaults(func=cmd_list)


def _total(node: NodeView, key: str, used: int | None, avail: int | None) -> int:
    total = node.get("totalResource") or {}
    if key in total:
        return int(total[key])
    return int(used or 0) + int(avail or 0)


def node_rows(nodes: list[NodeView], now_ms: float | None = None) -> list[list[object]]:
    """One row per YARN node record; totals from totalResource, else used + available."""
    rows = []
    for n in sorted(nodes, key=lambda n: n.get("id", "")):
        mem_total = _total(n, "memory", n.get("usedMemoryMB"), n.get("availMemoryMB"))
        vc_total = _total(n, "vCores", n.get("usedVirtualCores"), n.get("availableVirtualCores"))
        rows.append([n.get("id", ""), n.get("state", ""), n.get("nodeHTTPAddress", ""),
                     n.get("numContainers", 0), f"{n.get('usedMemoryMB', 0)}/{mem_total}",
                     f"{n.get('usedVirtualCores', 0)}/{vc_total}",
                     format_age(n.get("lastHeartbeat", n.get("lastHealthUpdate")), now_ms)])
    return rows


def cmd_list(args: argparse.Namespace, ctx: CliContext) -> int:
    async def go() -> list[NodeView]:
        async with RmRestClient(ctx.rm_url, ctx.user) as c:
            return await c.nodes()
    nodes = asyncio.run(go())
    if not args.all:
        nodes = [n for n in nodes if n.get("state") in ("NEW", "RUNNING", "UNHEALTHY", None)]
    ctx.out.write(render_table(NODE_HEADERS, node_rows(nodes)) + "\n")
    ctx.out.write(f"Total nodes: {len(nodes)}\n")
    return EXIT_OK
