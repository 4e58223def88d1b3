"""Node bandwidth caps on a real local cluster: netns mode (root + iproute2; measured throughput
between two node namespaces, teardown) and emulated mode (the cap reaches the containers)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from appmaster.distributed_shell import build_submission
from conftest import submit_app, wait_app
from elastane_cli import node_network as nn
from elastane_cli.local_cluster import LocalCluster
from protocol import container_env

pytestmark = pytest.mark.cluster

NETNS_REASON = nn.netns_unavailable_reason()
needs_netns = pytest.mark.skipif(NETNS_REASON is not None, reason=f"netns mode unavailable: {NETNS_REASON}")
CAP_BPS = 100_000_000

# Receiver: listen, say so on stdout, then report the Mbit/s seen from first byte to EOF.
RECEIVER = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept(); n = 0; t0 = None
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        t0 = t0 or time.monotonic(); n += len(b)
    print(n * 8 / (time.monotonic() - t0) / 1e6, flush=True)
""")
SENDER = textwrap.dedent("""
    import socket, sys
    c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); buf = b"x" * (1 << 20)
    for _ in range(int(sys.argv[3])):
        c.sendall(buf)
    c.close()
""")


def transfer_mbit_s(net: nn.ClusterNetwork, src: int, dst: int, mib: int, tmp: Path) -> float:
    """Send `mib` MiB from a process in node `src`'s namespace to one in node `dst`'s."""
    (tmp / "recv.py").write_text(RECEIVER)
    (tmp / "send.py").write_text(SENDER)
    recv = subprocess.Popen(["ip", "netns", "exec", net.namespace(dst), sys.executable, str(tmp / "recv.py"),
                             net.node_ip(dst)], stdout=subprocess.PIPE, text=True)
    try:
        port = recv.stdout.readline().strip()     # the receiver is listening once it prints its port
        assert port.isdigit(), f"receiver did not start: {port!r}"
        subprocess.run(["ip", "netns", "exec", net.namespace(src), sys.executable, str(tmp / "send.py"),
                        net.node_ip(dst), port, str(mib)], check=True, timeout=30)
        out, _ = recv.communicate(timeout=30)
        return float(out.strip())
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


def network_leftovers(tag: str) -> list[str]:
    return nn.leftovers(tag)


@needs_netns
def test_netns_cluster_caps_traffic_between_nodes_only(tmp_path):
    c = LocalCluster(tmp_path / "c", nodes=2, node_memory_mb=512, node_vcores=1, heartbeat_interval_ms=250,
                     node_bandwidth="100mbit", network="netns")
    tag = nn.cluster_tag(tmp_path / "c" / "hosts")    # the nodes are testbed hosts under <dir>/hosts
    try:
        c.start(timeout_s=60)
        net = c.net
        assert c.network_mode == "netns" and net is not None and net.tag == tag
        # The RM is advertised on the bridge; every NM registered with its own namespace address.
        assert c.rm_url.startswith(f"http://{net.bridge_ip}:")
        for i, n in enumerate(c.nodes):
            assert n.node_id.startswith(f"{net.node_ip(i)}:") and n.http_address.startswith(net.node_ip(i))
        assert sorted(network_leftovers(tag)) == sorted([net.bridge, net.host_veth(0), net.host_veth(1),
                                                         net.namespace(0), net.namespace(1)])
        # The caps are where they belong: a 100mbit tbf on each node's eth0 and its host-side veth,
        # nothing on a node's loopback (what a load-proof check can say about "uncapped").
        for cmd in (["tc", "-n", net.namespace(0), "qdisc", "show", "dev", "eth0"],
                    ["tc", "qdisc", "show", "dev", net.host_veth(1)]):
            shown = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            assert "tbf" in shown and "rate 100Mbit" in shown, (cmd, shown)
        lo = subprocess.run(["tc", "-n", net.namespace(0), "qdisc", "show", "dev", "lo"],
                            capture_output=True, text=True, check=True).stdout
        assert "tbf" not in lo and "rate" not in lo, lo
        # And the cap holds on real traffic: a busy host can slow a transfer, never speed it past it.
        between = transfer_mbit_s(net, 0, 1, 6, tmp_path)
        assert 0 < between <= 110, f"{between:.1f} Mbit/s between two 100mbit nodes"
    finally:
        c.stop()
    assert network_leftovers(tag) == [] and c.network_errors == []


@needs_netns
def test_netns_cluster_runs_an_app_whose_am_reaches_the_rm_over_the_bridge(tmp_path):
    with LocalCluster(tmp_path / "c", nodes=2, node_memory_mb=512, node_vcores=1, heartbeat_interval_ms=250,
                      node_bandwidth="1gbit", network="netns") as c:
        sub = build_submission("bw", ["sh", "-c", f"echo host=$NM_HOST bw=${container_env.NODE_BANDWIDTH_BPS}"],
                               1, 128, 1)
        app_id = submit_app(c.rm_url, sub)
        app = wait_app(c.rm_url, app_id, ("FINISHED",), 60)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
        outs = [f.read_text() for n in c.nodes for f in (Path(n.log_dir) / app_id).glob("*/stdout")]
        lines = [ln for o in outs for ln in o.splitlines() if ln.startswith("host=")]
        # The kernel enforces the cap here: containers get no emulation variable.
        assert len(lines) == 1 and lines[0].split()[1] == "bw="
        assert lines[0].split()[0][len("host="):] in {c.net.node_ip(0), c.net.node_ip(1)}


def test_stop_from_the_cluster_dir_removes_a_crashed_runs_network(tmp_path):
    if NETNS_REASON is not None:
        pytest.skip(f"netns mode unavailable: {NETNS_REASON}")
    c = LocalCluster(tmp_path / "c", nodes=1, node_memory_mb=512, node_vcores=1, heartbeat_interval_ms=250,
                     node_bandwidth="1gbit", network="netns")
    c.start(timeout_s=60)
    tag = c.net.tag
    try:
        for spawned in c._spawned.values():  # a "crash": the daemons die, nobody tears the namespaces down
            spawned.popen.kill()
            spawned.popen.wait()
            spawned.log.close()
        c._spawned.clear()
        assert network_leftovers(tag)
    finally:
        LocalCluster.load(tmp_path / "c").stop()      # what is tested, and the cleanup if anything above failed
    assert network_leftovers(tag) == []


def test_emulated_cluster_tells_containers_the_cap(tmp_path):
    with LocalCluster(tmp_path / "c", nodes=1, node_memory_mb=1024, node_vcores=2, heartbeat_interval_ms=250,
                      node_bandwidth="250mbit", network="emulated") as c:
        assert c.network_mode == "emulated" and c.net is None
        assert c.nodes[0].node_id.startswith("127.0.0.1:")
        sub = build_submission("bw", ["sh", "-c", f"echo bw=${container_env.NODE_BANDWIDTH_BPS}"], 1, 128, 1)
        app_id = submit_app(c.rm_url, sub)
        app = wait_app(c.rm_url, app_id, ("FINISHED",), 60)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
        outs = [f.read_text() for f in (Path(c.nodes[0].log_dir) / app_id).glob("*/stdout")]
        assert "bw=250000000" in "".join(outs)


@needs_netns
def test_node_cpus_puts_each_node_and_its_containers_in_a_cpu_budget_of_its_own(tmp_path):
    with LocalCluster(tmp_path / "c", nodes=2, node_memory_mb=512, node_vcores=1, heartbeat_interval_ms=250,
                      node_cpus=0.5) as c:
        assert c.network_mode == "netns" and c.hosts is not None
        sub = build_submission("cpu", ["sh", "-c", "cat /proc/self/cgroup; hostname"], 1, 128, 1)
        app_id = submit_app(c.rm_url, sub)
        app = wait_app(c.rm_url, app_id, ("FINISHED",), 60)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
        for i, node in enumerate(c.nodes):
            host = c.hosts.host(i)
            assert host.budget is not None
            quotas = [Path(d, "cpu.cfs_quota_us") for d in host.budget.dirs.values()] + \
                     [Path(d, "cpu.max") for d in host.budget.dirs.values()]
            values = [q.read_text().split()[0] for q in quotas if q.exists()]
            assert values and all(v == "50000" for v in values), values
            # The NM runs inside its host's budget (seen from outside: the host's cgroup path).
            own = Path(f"/proc/{node.pid}/cgroup").read_text()
            assert f"/{host.name}/system" in own, own
        out = "".join(f.read_text() for n in c.nodes for f in (Path(n.log_dir) / app_id).glob("*/stdout"))
        # Inside, the host's cgroup is the root: the container's cgroup is the NM's, nested there.
        assert "/elastane/" in out and "elastane-testbed" not in out, out
        assert any(name in out.split() for name in ("nm0", "nm1")), out
        budget_dirs = [d for i in range(2) for d in c.hosts.cgroup_dirs(i)]
        assert any("/elastane" in d for d in budget_dirs), budget_dirs
    assert all(not Path(d).exists() for h in c.hosts.hosts for d in (h.budget.dirs.values() if h.budget else []))
