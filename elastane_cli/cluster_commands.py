"""`elastane cluster start | stop | status`: a whole local cluster in the background."""
from __future__ import annotations

import argparse
from pathlib import Path

from psruntime.wire.bandwidth import format_rate, parse_rate

from .arg_types import positive_int
from . import node_network, processes
from .context import CliContext
from .errors import EXIT_OK, OperationFailed, UsageError
from .local_cluster import ClusterStartError, LocalCluster

YARN_RM_PORT = 8088


def _port(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {v!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535 (0 = any free port), got {n}")
    return n


def _rate(v: str) -> int:
    try:
        return parse_rate(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _cores(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of cores: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"a CPU budget must be > 0 cores, got {text}")
    return v


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    cluster = sub.add_parser("cluster", help="start / stop a whole cluster on this machine")
    acts = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = acts.add_parser("start", help="start an RM and N NMs in the background")
    p.add_argument("--nodes", type=positive_int("--nodes"), default=3)
    p.add_argument("--dir", type=Path, help="cluster dir (default: $ELASTANE_CLUSTER_DIR or ~/.elastane/cluster)")
    p.add_argument("--rm-port", type=_port, default=YARN_RM_PORT, help="RM port (0 = any free port)")
    p.add_argument("--node-memory", type=positive_int("--node-memory"), default=2048, metavar="MB")
    p.add_argument("--node-vcores", type=positive_int("--node-vcores"), default=2, metavar="N")
    p.add_argument("--cgroups", choices=["auto", "v1", "v2", "off"], default="auto")
    p.add_argument("--policy", default="static", help="elastic policy: static | drf | tetris | eps | optimus | dorm | harmony")
    p.add_argument("--heartbeat-interval-ms", type=positive_int("--heartbeat-interval-ms"), default=1000)
    p.add_argument("--node-bandwidth", type=_rate, metavar="RATE",
                   help="cap each node's network, tc units: 100mbit, 1gbit, 125mbps (bps = bytes/s)")
    p.add_argument("--network", choices=node_network.MODES, default="auto",
                   help="how to cap: netns (tc on a namespace per node; root), emulated (token bucket in "
                        "the data plane, per executor), auto (netns where possible)")
    p.add_argument("--node-cpus", type=_cores, metavar="CORES",
                   help="give each node a CPU budget of its own (a cgroup holding the NM and its containers, "
                        "e.g. 0.5 or 4): the nodes become testbed hosts, each with its own network namespace "
                        "and /tmp (root); docs/testbed.md")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for every node")
    p.set_defaults(func=cmd_start)

    p = acts.add_parser("stop", help="stop the cluster recorded in DIR/cluster.json")
    p.add_argument("--dir", type=Path)
    p.add_argument("--timeout", type=float, default=20.0)
    p.set_defaults(func=cmd_stop)

    p = acts.add_parser("status", help="which of the cluster's daemons are running")
    p.add_argument("--dir", type=Path)
    p.set_defaults(func=cmd_status)


def _dir(args: argparse.Namespace, ctx: CliContext) -> Path:
    return (args.dir or ctx.cluster_dir).expanduser().resolve()


def _load(base: Path) -> LocalCluster:
    try:
        return LocalCluster.load(base)
    except FileNotFoundError:
        raise OperationFailed(f"no cluster recorded in {base} (no {LocalCluster.STATE_FILE})") from None
    except (ValueError, KeyError, TypeError) as e:
        raise OperationFailed(f"{base / LocalCluster.STATE_FILE} is unreadable: {e}") from None


def cmd_start(args: argparse.Namespace, ctx: CliContext) -> int:
    base = _dir(args, ctx)
    if (base / LocalCluster.STATE_FILE).exists():
        old = _load(base)
        if old.running():
            raise OperationFailed(f"a cluster is already running from {base} (RM pid {old.rm_pid} at "
                                  f"{old.rm_url}); stop it with `elastane cluster stop --dir {base}`")
    try:
        cluster = LocalCluster(base, nodes=args.nodes, node_memory_mb=args.node_memory,
                               node_vcores=args.node_vcores, rm_port=args.rm_port, cgroups=args.cgroups,
                               policy=args.policy, heartbeat_interval_ms=args.heartbeat_interval_ms,
                               node_bandwidth=args.node_bandwidth, network=args.network,
                               node_cpus=args.node_cpus)
    except ValueError as e:
        raise UsageError(str(e)) from None
    ctx.err.write(f"starting an RM and {args.nodes} NMs under {base} ...\n")
    try:
        cluster.start(timeout_s=args.timeout)
    except ClusterStartError as e:
        raise OperationFailed(f"the cluster did not start:\n{e}") from None
    cluster.save_state()
    if cluster.node_cpus:
        ctx.err.write(f"node CPU budget {cluster.node_cpus:g} cores each (a cgroup per node host)\n")
    if cluster.node_bandwidth_bps:
        how = (f"tc on a network namespace per node, bridge {cluster.net.bridge} {cluster.net.bridge_ip}"
               if cluster.net else "emulated by a token bucket in each executor's data plane")
        ctx.err.write(f"node bandwidth {format_rate(cluster.node_bandwidth_bps)}: {how}\n")
    ctx.err.write(f"cluster up: {len(cluster.nodes)} nodes, logs in {base / 'logs'}; "
                  f"stop it with `elastane cluster stop --dir {base}`\n")
    ctx.out.write(cluster.rm_url + "\n")
    return EXIT_OK


def cmd_stop(args: argparse.Namespace, ctx: CliContext) -> int:
    base = _dir(args, ctx)
    cluster = _load(base)
    was = [p for p in cluster.pids() if processes.is_alive(p)]
    cluster.stop(timeout_s=args.timeout)
    left = [p for p in cluster.pids() if processes.is_alive(p)]
    if left:
        raise OperationFailed(f"processes still alive after stop: {left}")
    if cluster.network_errors:
        raise OperationFailed("could not remove the node network: " + "; ".join(cluster.network_errors))
    ctx.out.write(f"stopped the cluster in {base} ({len(was)} daemons were running)\n")
    return EXIT_OK


def cmd_status(args: argparse.Namespace, ctx: CliContext) -> int:
    base = _dir(args, ctx)
    cluster = _load(base)
    rows = [("rm", cluster.rm_pid, cluster.rm_start_ticks, cluster.rm_url)]
    rows += [(f"nm{n.index}", n.pid, n.start_ticks, n.node_id) for n in cluster.nodes]
    for name, pid, ticks, what in rows:
        state = "running" if processes.is_alive(pid, ticks) else "stopped"
        ctx.out.write(f"{name:<5} pid {pid:<8} {state:<8} {what}\n")
    return EXIT_OK if cluster.running() else 1

