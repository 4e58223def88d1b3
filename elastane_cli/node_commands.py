"""`elastane node list`: the cluster's nodes from the RM's /ws/v1/cluster/nodes; `elastane node
decommission` / `recommission`: an admin takes a node out gracefully (YARN's graceful decommission,
PUT /ws/v1/cluster/nodes/{id}/state) or brings it back."""
from __future__ import annotations

import argparse
import asyncio

from protocol.yarn_views import NodeView

from .arg_types import non_negative_float
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
    p.add_argument("--show-details", action="store_true",
                   help="add each node's health report (why it is UNHEALTHY), as yarn node -list -showDetails")
    p.set_defaults(func=cmd_list)
    p = acts.add_parser("decommission", parents=[common],
                        help="place nothing new on a node; stop its NM once its containers have ended")
    p.add_argument("node_id", help="the node's id (host:port, as `node list` shows it)")
    p.add_argument("--timeout", type=non_negative_float("--timeout"), default=None, metavar="SECONDS",
                   help="kill the containers still running after this many seconds (default: wait for them)")
    p.set_defaults(func=cmd_decommission)
    p = acts.add_parser("recommission", parents=[common],
                        help="undo a decommission (a decommissioned node's NM may then register again)")
    p.add_argument("node_id", help="the node's id")
    p.set_defaults(func=cmd_recommission)


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
        nodes = [n for n in nodes if n.get("state") in ("NEW", "RUNNING", "UNHEALTHY", "DECOMMISSIONING", None)]
    rows = node_rows(nodes)
    if args.show_details:
        reports = {n.get("id", ""): str(n.get("healthReport") or "-").replace("\n", "; ") for n in nodes}
        ctx.out.write(render_table([*NODE_HEADERS, "HEALTH-REPORT"], [[*r, reports[str(r[0])]] for r in rows]) + "\n")
    else:
        ctx.out.write(render_table(NODE_HEADERS, rows) + "\n")
    ctx.out.write(f"Total nodes: {len(nodes)}\n")
    return EXIT_OK


def _set_state(ctx: CliContext, node_id: str, state: str, timeout_s: float | None = None) -> NodeView:
    async def go() -> NodeView:
        async with RmRestClient(ctx.rm_url, ctx.user) as c:
            return await c.put_node_state(node_id, state, timeout_s)
    return asyncio.run(go())


def cmd_decommission(args: argparse.Namespace, ctx: CliContext) -> int:
    node = _set_state(ctx, args.node_id, "DECOMMISSIONING", args.timeout)
    how = "when its containers have ended" if args.timeout is None else \
        f"when its containers have ended, or are killed after {args.timeout:g} s"
    ctx.out.write(f"Node {args.node_id} is {node.get('state')}: nothing new is placed on it; "
                  f"its NodeManager is told to stop {how}\n")
    return EXIT_OK


def cmd_recommission(args: argparse.Namespace, ctx: CliContext) -> int:
    node = _set_state(ctx, args.node_id, "RUNNING")
    if node.get("state") == "RUNNING":
        ctx.out.write(f"Node {args.node_id} is RUNNING again\n")
    else:
        ctx.out.write(f"Node {args.node_id} recommissioned: its NodeManager may register again\n")
    return EXIT_OK
