"""A network namespace per node of a local cluster, on a bridge, each capped with tc.

Real mode of the local cluster's node bandwidth caps (the emulated mode is
psruntime.wire.bandwidth). For the cluster whose tag is T (a hash of its directory):

    bridge  el-T         10.213.X.1/24 in the root namespace (the RM is reached here)
    netns   el-T-n<i>    eth0 = 10.213.X.(10+i)/24, lo up, default route via the bridge
    veth    el-T-<i>     the bridge-side end of node i's link, enslaved to the bridge

Node i's egress is capped by a tbf qdisc on its eth0, its ingress by one on el-T-<i> (the
bridge-side end's egress), so a transfer between two nodes runs at the cap while traffic inside
a node (to its own address, over lo) is not capped, as on a real host. X is a free /24 of
10.213.0.0/16, chosen under a lock file so concurrent clusters do not pick the same one.

Processes enter a node's namespace with `nsenter --net=...`, which (unlike `ip netns exec`)
leaves the mount namespace alone, so the NM still sees /sys/fs/cgroup and can enforce cgroups.
Every name carries the tag, so a crashed run's leftovers are found (`leftovers`) and removed
(`remove`) from the cluster dir alone.
"""
from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import msgspec

from psruntime.wire.bandwidth import default_burst_bytes
from protocol.errors import HostError
from protocol.json_types import JsonObject

MODES = ("auto", "netns", "emulated")
SUBNET_PREFIX = "10.213"
FIRST_NODE_HOST = 10
MAX_NODES = 240               # 10.213.X.10 .. 10.213.X.249
NETNS_DIR = Path("/run/netns")
LOCK_PATHS = (Path("/run/lock/elastane-node-network.lock"), Path("/tmp/elastane-node-network.lock"))
TBF_LATENCY_MS = 50           # queueing allowed before tbf drops: enough for TCP to see the rate


class NodeNetworkError(HostError, RuntimeError):
    """A namespace / bridge / tc command failed; the message carries the command and its stderr."""


Runner = Callable[[list[str]], str]


def run(cmd: list[str]) -> str:
    """Run one command, return its stdout; NodeNetworkError with its stderr if it fails."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NodeNetworkError(f"{' '.join(cmd)}: {e}") from None
    if p.returncode != 0:
        raise NodeNetworkError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def netns_unavailable_reason(runner: Runner = run) -> str | None:
    """Why real per-node namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "not running as root (network namespaces and tc need CAP_NET_ADMIN)"
    for tool in ("ip", "tc", "nsenter"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (needs iproute2 and util-linux)"
    try:
        runner(["ip", "netns", "list"])
        runner(["tc", "qdisc", "show", "dev", "lo"])
    except NodeNetworkError as e:
        return f"network namespaces unusable: {e}"
    return None


def resolve_mode(mode: str, bandwidth_bps: int | None, runner: Runner = run) -> str:
    """"netns", "emulated" or "none" (no bandwidth and no namespaces asked for).

    "auto" picks netns where the machine allows it, else emulated; an explicit "netns" that
    cannot work is an error naming the reason.
    """
    if mode not in MODES:
        raise ValueError(f"network must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "emulated":
        if not bandwidth_bps:
            raise ValueError("network='emulated' needs a node bandwidth (e.g. node_bandwidth='1gbit')")
        return "emulated"
    if mode == "auto" and not bandwidth_bps:
        return "none"
    reason = netns_unavailable_reason(runner)
    if reason is None:
        return "netns"
    if mode == "netns":
        raise NodeNetworkError(f"network='netns' is not possible here: {reason}")
    return "emulated"


def cluster_tag(base_dir: Path) -> str:
    """Six hex digits from the cluster dir: the same dir always gives the same names."""
    return hashlib.sha1(str(Path(base_dir).resolve()).encode()).hexdigest()[:6]


@dataclass
class ClusterNetwork:
    """The namespaces, links and addresses of one local cluster (what `remove` tears down)."""

    tag: str
    subnet: int                     # X in 10.213.X.0/24
    nodes: int
    bandwidth_bps: int | None
    namespaces: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"el-{self.tag}"

    @property
    def bridge_ip(self) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.1"

    def node_ip(self, i: int) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.{FIRST_NODE_HOST + i}"

    def namespace(self, i: int) -> str:
        return namespace_name(self.tag, i)

    def host_veth(self, i: int) -> str:
        return f"el-{self.tag}-{i}"

    def exec_prefix(self, i: int) -> list[str]:
        """Prefix for a command that must run in node i's namespace (keeps the pid: nsenter execs)."""
        return ["nsenter", f"--net={NETNS_DIR / self.namespace(i)}", "--"]

    def to_json(self) -> JsonObject:
        out: JsonObject = msgspec.to_builtins(self)
        return out

    @classmethod
    def from_json(cls, d: object) -> "ClusterNetwork":
        """`to_json`'s object read back (msgspec.ValidationError naming a bad field)."""
        return msgspec.convert(d, cls)


def namespace_name(tag: str, i: int) -> str:
    return f"el-{tag}-n{i}"


@contextmanager
def _allocation_lock() -> Iterator[None]:
    """Serialise subnet choice + bridge creation between clusters starting at the same time."""
    for path in LOCK_PATHS:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = open(path, "a")
            break
        except OSError:
            continue
    else:  # nowhere to lock: still correct unless two clusters start in the same instant
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def used_subnets(runner: Runner = run) -> set[int]:
    """The X of every 10.213.X.0/24 already holding an address or a route in the root namespace."""
    text = runner(["ip", "-4", "-o", "addr", "show"]) + "\n" + runner(["ip", "-4", "route", "show"])
    used: set[int] = set()
    for m in re.finditer(r"\b10\.213\.(\d{1,3})\.\d{1,3}(/(\d+))?", text):
        x = int(m.group(1))
        if m.group(3) is not None and int(m.group(3)) < 24:
            # A route or address covering more than one /24 of ours: treat all of 10.213/16 as taken.
            net = ipaddress.ip_network(m.group(0), strict=False)
            used.update(range(256) if net.prefixlen <= 16 else
                        {int(str(a).split(".")[2]) for a in net.subnets(new_prefix=24)})
        else:
            used.add(x)
    return used


def choose_subnet(tag: str, used: set[int]) -> int:
    """A free X in 1..254, starting from one derived from the tag (stable when it is free)."""
    start = int(tag, 16) % 254 + 1
    for k in range(254):
        x = (start - 1 + k) % 254 + 1
        if x not in used:
            return x
    raise NodeNetworkError(f"no free /24 left in {SUBNET_PREFIX}.0.0/16")


def tbf_args(bps: int) -> list[str]:
    """The tc tbf parameters for `bps`: burst of 4 ms (>= 64 KiB, so GSO packets pass whole)."""
    return ["tbf", "rate", f"{bps}bit", "burst", str(default_burst_bytes(bps)),
            "latency", f"{TBF_LATENCY_MS}ms"]


def create(base_dir: Path, nodes: int, bandwidth_bps: int | None, runner: Runner = run) -> ClusterNetwork:
    """Build the bridge, one namespace + capped veth per node; on any failure remove what was made."""
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"a netns cluster has 1..{MAX_NODES} nodes, got {nodes}")
    tag = cluster_tag(base_dir)
    stale = leftovers(tag, runner)
    if stale:
        busy = [ns for ns in stale if ns.startswith(f"el-{tag}-n") and namespace_pids(ns, runner)]
        if busy:
            raise NodeNetworkError(f"namespaces {busy} of a cluster in {base_dir} still have processes; "
                                   f"stop it first (elastane cluster stop --dir {base_dir})")
        remove_tag(tag, runner)  # a crashed run of the same dir
    with _allocation_lock():
        net = ClusterNetwork(tag=tag, subnet=choose_subnet(tag, used_subnets(runner)), nodes=nodes,
                             bandwidth_bps=bandwidth_bps)
        try:
            runner(["ip", "link", "add", net.bridge, "type", "bridge"])
            runner(["ip", "addr", "add", f"{net.bridge_ip}/24", "dev", net.bridge])
            runner(["ip", "link", "set", net.bridge, "up"])
        except BaseException:
            remove(net, runner)
            raise
    try:
        for i in range(nodes):
            _add_node(net, i, runner)
    except BaseException:
        remove(net, runner)
        raise
    return net


def _add_node(net: ClusterNetwork, i: int, runner: Runner) -> None:
    ns, veth = net.namespace(i), net.host_veth(i)
    runner(["ip", "netns", "add", ns])
    net.namespaces.append(ns)
    # The peer is born inside the namespace as eth0: no name clash in the root namespace.
    runner(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    runner(["ip", "link", "set", veth, "master", net.bridge])
    runner(["ip", "link", "set", veth, "up"])
    runner(["ip", "-n", ns, "link", "set", "lo", "up"])
    runner(["ip", "-n", ns, "addr", "add", f"{net.node_ip(i)}/24", "dev", "eth0"])
    runner(["ip", "-n", ns, "link", "set", "eth0", "up"])
    runner(["ip", "-n", ns, "route", "add", "default", "via", net.bridge_ip])
    if net.bandwidth_bps:
        runner(["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", *tbf_args(net.bandwidth_bps)])
        runner(["tc", "qdisc", "replace", "dev", veth, "root", *tbf_args(net.bandwidth_bps)])


def namespace_pids(ns: str, runner: Runner = run) -> list[int]:
    """Pids of processes inside namespace `ns` ([] if none or it is gone)."""
    try:
        return [int(p) for p in runner(["ip", "netns", "pids", ns]).split()]
    except NodeNetworkError:
        return []


def leftovers(tag: str, runner: Runner = run) -> list[str]:
    """Namespaces and root-namespace links named for cluster `tag` that exist now."""
    names = []
    for line in runner(["ip", "netns", "list"]).splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(f"el-{tag}-n"):
            names.append(name)
    for line in runner(["ip", "-o", "link", "show"]).splitlines():
        m = re.match(r"\d+:\s+([^:@\s]+)", line)
        if m and (m.group(1) == f"el-{tag}" or m.group(1).startswith(f"el-{tag}-")):
            names.append(m.group(1))
    return names


def remove_tag(tag: str, runner: Runner = run) -> list[str]:
    """Delete everything `leftovers(tag)` finds; return the errors (best effort, never raises)."""
    errors: list[str] = []
    try:
        names = leftovers(tag, runner)
    except NodeNetworkError as e:
        return [str(e)]
    # Namespaces first (deleting one deletes its veth pair), then links still in the root namespace.
    for name in sorted(names, key=lambda n: (not n.startswith(f"el-{tag}-n"), n == f"el-{tag}")):
        cmd = ["ip", "netns", "delete", name] if name.startswith(f"el-{tag}-n") else ["ip", "link", "delete", name]
        try:
            runner(cmd)
        except NodeNetworkError as e:
            if "Cannot find" not in str(e) and "No such" not in str(e) and "does not exist" not in str(e):
                errors.append(str(e))
    return errors


def remove(net: ClusterNetwork, runner: Runner = run) -> list[str]:
    """Tear down the cluster's namespaces, veths and bridge; return the errors (never raises)."""
    return remove_tag(net.tag, runner)
