"""Per-node network namespaces without touching the machine: the commands issued (a fake runner),
teardown after a half-built start, subnet choice, mode resolution, and the CLI / LocalCluster flags."""
from __future__ import annotations

from pathlib import Path

import pytest

from elastane_cli import main as cli
from elastane_cli import node_network as nn
from elastane_cli.local_cluster import LocalCluster


class FakeIp:
    """Plays `ip` / `tc`: keeps the namespaces and links the commands create, fails on request."""

    def __init__(self, addrs: str = "", routes: str = "", fail_on: str | None = None) -> None:
        self.addrs, self.routes, self.fail_on = addrs, routes, fail_on
        self.calls: list[list[str]] = []
        self.namespaces: set[str] = set()
        self.links: set[str] = set()

    def __call__(self, cmd: list[str]) -> str:
        self.calls.append(cmd)
        line = " ".join(cmd)
        if self.fail_on is not None and self.fail_on in line:
            raise nn.NodeNetworkError(f"{line} failed (2): RTNETLINK answers: Operation not permitted")
        if cmd[:4] == ["ip", "-4", "-o", "addr"]:
            return self.addrs
        if cmd[:4] == ["ip", "-4", "route", "show"]:
            return self.routes
        if cmd[:3] == ["ip", "netns", "list"]:
            return "".join(f"{n} (id: 0)\n" for n in sorted(self.namespaces))
        if cmd[:3] == ["ip", "netns", "pids"]:
            return ""
        if cmd[:4] == ["ip", "-o", "link", "show"]:
            return "".join(f"{i}: {n}: <BROADCAST> mtu 1500\n" for i, n in enumerate(sorted(self.links), 5))
        if cmd[:3] == ["ip", "netns", "add"]:
            self.namespaces.add(cmd[3])
        elif cmd[:3] == ["ip", "netns", "delete"]:
            self.namespaces.discard(cmd[3])
            self.links -= {n for n in self.links if n.endswith("-" + cmd[3].rsplit("-n", 1)[1])}
        elif cmd[:3] == ["ip", "link", "add"]:
            self.links.add(cmd[3])
        elif cmd[:3] == ["ip", "link", "delete"]:
            self.links.discard(cmd[3])
        return ""


def test_create_builds_a_capped_namespace_per_node(tmp_path):
    ip = FakeIp()
    net = nn.create(tmp_path, 2, 100_000_000, ip)
    tag = nn.cluster_tag(tmp_path)
    assert net.bridge == f"el-{tag}" and net.namespaces == [f"el-{tag}-n0", f"el-{tag}-n1"]
    assert net.bridge_ip == f"10.213.{net.subnet}.1" and net.node_ip(1) == f"10.213.{net.subnet}.11"
    cmds = [" ".join(c) for c in ip.calls]
    assert f"ip addr add 10.213.{net.subnet}.1/24 dev el-{tag}" in cmds
    assert f"ip link add el-{tag}-1 type veth peer name eth0 netns el-{tag}-n1" in cmds
    assert f"ip -n el-{tag}-n1 addr add 10.213.{net.subnet}.11/24 dev eth0" in cmds
    assert f"ip -n el-{tag}-n0 route add default via 10.213.{net.subnet}.1" in cmds
    # Both directions capped: the node's own egress, and the bridge side (= the node's ingress).
    assert sum(c.startswith(f"tc -n el-{tag}-n") and "tbf rate 100000000bit" in c for c in cmds) == 2
    assert sum(c.startswith(f"tc qdisc replace dev el-{tag}-") and "tbf rate 100000000bit" in c for c in cmds) == 2
    assert net.exec_prefix(0) == ["nsenter", f"--net=/run/netns/el-{tag}-n0", "--"]
    assert nn.remove(net, ip) == [] and not ip.namespaces and not ip.links


def test_no_tc_without_a_bandwidth(tmp_path):
    ip = FakeIp()
    nn.create(tmp_path, 1, None, ip)
    assert not [c for c in ip.calls if c[0] == "tc"]


@pytest.mark.parametrize("step", ["veth peer name eth0 netns", "tc qdisc replace dev el-", "link set el-"])
def test_a_failure_half_way_removes_everything_made(tmp_path, step):
    ip = FakeIp(fail_on=step)
    with pytest.raises(nn.NodeNetworkError, match="Operation not permitted"):
        nn.create(tmp_path, 3, 10**9, ip)
    assert not ip.namespaces and not ip.links


def test_leftovers_of_a_crashed_run_are_found_and_removed_before_reuse(tmp_path):
    ip = FakeIp()
    nn.create(tmp_path, 2, None, ip)            # never removed: a crashed run
    tag = nn.cluster_tag(tmp_path)
    assert sorted(nn.leftovers(tag, ip)) == sorted([f"el-{tag}", f"el-{tag}-0", f"el-{tag}-1",
                                                    f"el-{tag}-n0", f"el-{tag}-n1"])
    other = FakeIp()
    other.namespaces, other.links = set(ip.namespaces), set(ip.links)
    nn.create(tmp_path, 1, None, other)         # same dir again: the stale ones go first
    assert other.namespaces == {f"el-{tag}-n0"}
    assert nn.leftovers("ffffff", ip) == []     # another cluster's names are never touched


def test_subnets_in_use_are_skipped():
    used = nn.used_subnets(FakeIp(addrs="3: el-x    inet 10.213.7.1/24 brd 10.213.7.255 scope global el-x\n",
                                  routes="10.213.9.0/24 dev foo proto kernel\n10.213.64.0/22 via 10.0.0.1\n"))
    assert {7, 9, 64, 65, 66, 67} <= used and 8 not in used
    assert nn.choose_subnet("000006", set()) == 7
    assert nn.choose_subnet("000006", {7, 8}) == 9
    assert nn.used_subnets(FakeIp(routes="10.213.0.0/16 dev bar\n")) >= set(range(1, 255))
    with pytest.raises(nn.NodeNetworkError, match="no free /24"):
        nn.choose_subnet("000006", set(range(256)))


def test_tag_is_stable_per_dir_and_names_fit_interface_limits(tmp_path):
    assert nn.cluster_tag(tmp_path) == nn.cluster_tag(tmp_path / "." )
    assert nn.cluster_tag(tmp_path / "a") != nn.cluster_tag(tmp_path / "b")
    net = nn.ClusterNetwork(tag="abcdef", subnet=5, nodes=240, bandwidth_bps=None)
    assert len(net.host_veth(239)) <= 15 and len(net.bridge) <= 15   # IFNAMSIZ - 1
    assert nn.ClusterNetwork.from_json(net.to_json()) == net


def test_mode_resolution():
    unusable = FakeIp(fail_on="netns list")
    assert nn.resolve_mode("auto", None, unusable) == "none"
    assert nn.resolve_mode("emulated", 10**9, unusable) == "emulated"
    with pytest.raises(ValueError, match="needs a node bandwidth"):
        nn.resolve_mode("emulated", None, unusable)
    with pytest.raises(ValueError, match="network must be one of"):
        nn.resolve_mode("wifi", 10**9, unusable)
    if nn.netns_unavailable_reason() is None:
        assert nn.resolve_mode("auto", 10**9, FakeIp()) == "netns"
    assert nn.resolve_mode("auto", 10**9, unusable) == "emulated"
    with pytest.raises(nn.NodeNetworkError, match="not possible here"):
        nn.resolve_mode("netns", 10**9, unusable)


def test_local_cluster_validates_the_network_arguments(tmp_path):
    with pytest.raises(ValueError, match="bad rate 'fast'"):
        LocalCluster(tmp_path, node_bandwidth="fast")
    with pytest.raises(ValueError, match="network must be one of"):
        LocalCluster(tmp_path, node_bandwidth="1gbit", network="wifi")
    with pytest.raises(ValueError, match="needs node_bandwidth"):
        LocalCluster(tmp_path, network="emulated")
    c = LocalCluster(tmp_path, node_bandwidth="1gbit")
    assert c.node_bandwidth_bps == 10**9


@pytest.mark.parametrize("argv, message", [
    (["cluster", "start", "--node-bandwidth", "fast"], "bad rate 'fast'"),
    (["cluster", "start", "--node-bandwidth", "0mbit"], "out of range"),
    (["cluster", "start", "--node-bandwidth", "1gbit", "--network", "wifi"], "invalid choice: 'wifi'"),
])
def test_cli_rejects_bad_bandwidth_flags_with_exit_2(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--dir", str(tmp_path)])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (Path(tmp_path) / "cluster.json").exists()
