"""The address an NM advertises (node id, NM_HOST, the URL the RM and AMs use) when hosts share one
conf dir: the route to the RM for wildcard binds, per-host override files, the --advertise-host flag,
the loopback-to-a-remote-RM start-up error, and a real check inside network namespaces."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from elastane_cli import node_network as nn
from nodemanager import node_settings
from nodemanager.__main__ import main as nm_main
from protocol import config as pconfig
from protocol.config import ClusterConfig, ConfigError, NMConfig
from protocol.internal_api import LaunchContext
from protocol.nm_client import NMClient
from protocol.records import ContainerState
from polling import async_wait_until
from nm_harness import (REPO, SECRET, FakeNodeRM, NMProcess, container_token, kill_nm, new_ids, stop_nm,
                             write_configs)


class FakeNet:
    """Name resolution and routing as a test says they are; records what was asked."""

    def __init__(self, names: dict[str, list[str]], routes: dict[str, str]):
        self.names, self.routes = names, routes
        self.routed: list[tuple[str, int]] = []

    def resolve(self, host: str) -> list[str]:
        if host not in self.names:
            raise OSError(f"[Errno -2] Name or service not known: {host}")
        return self.names[host]

    def route(self, ip: str, port: int) -> str:
        self.routed.append((ip, port))
        if ip not in self.routes:
            raise OSError("[Errno 101] Network is unreachable")
        return self.routes[ip]


def advertised(cfg: NMConfig, rm: str, net: FakeNet) -> str:
    return node_settings.advertise_host(cfg, rm, net.resolve, net.route)


# ---- the address choice ------------------------------------------------------------------------

def test_wildcard_bind_advertises_the_interface_that_routes_to_the_rm():
    net = FakeNet({"rm.example": ["10.1.2.3"]}, {"10.1.2.3": "10.1.2.7"})
    assert advertised(NMConfig(host="0.0.0.0"), "http://10.1.2.3:8088", net) == "10.1.2.7"
    assert advertised(NMConfig(host="::"), "http://rm.example:9000", net) == "10.1.2.7"
    assert net.routed == [("10.1.2.3", 8088), ("10.1.2.3", 9000)]


def test_rm_on_loopback_keeps_single_host_clusters_on_127_0_0_1():
    net = FakeNet({"localhost": ["127.0.0.1", "::1"], "myrm": ["127.0.1.1"]}, {})
    for rm in ("http://127.0.0.1:8088", "http://localhost:8088", "http://myrm:8088", "127.0.0.1:8088"):
        assert advertised(NMConfig(host="0.0.0.0"), node_settings.rm_address(NMConfig(rm_address=rm),
                                                                            ClusterConfig()), net) == "127.0.0.1"
    assert net.routed == []


def test_explicit_settings_win_over_the_route():
    net = FakeNet({}, {})   # nothing resolves: none of these may need to look anything up
    rm = "http://10.1.2.3:8088"
    assert advertised(NMConfig(host="0.0.0.0", advertise_host="worker3"), rm, net) == "worker3"
    assert advertised(NMConfig(host="10.9.9.9"), rm, net) == "10.9.9.9"          # a specific bind
    assert advertised(NMConfig(host="127.0.0.1"), rm, net) == "127.0.0.1"        # a loopback bind
    assert net.routed == []


def test_0_0_0_0_only_advertises_ipv4():
    net = FakeNet({"rm6": ["fd00::3", "10.1.2.3"], "only6": ["fd00::3"]}, {"10.1.2.3": "10.1.2.7", "fd00::3": "fd00::7"})
    assert advertised(NMConfig(host="0.0.0.0"), "http://rm6:8088", net) == "10.1.2.7"
    assert advertised(NMConfig(host="::"), "http://only6:8088", net) == "fd00::7"
    with pytest.raises(ConfigError, match="advertise_host") as e:
        advertised(NMConfig(host="0.0.0.0"), "http://only6:8088", net)
    assert "only6" in str(e.value)


def test_an_unresolvable_or_unroutable_rm_is_an_error_naming_the_settings():
    net = FakeNet({"far": ["192.0.2.1"]}, {})
    with pytest.raises(ConfigError, match=r"'nowhere'.*rm_address.*set advertise_host"):
        advertised(NMConfig(host="0.0.0.0"), "http://nowhere:8088", net)
    with pytest.raises(ConfigError, match=r"no route to the RM at http://far:8088.*set advertise_host"):
        advertised(NMConfig(host="0.0.0.0"), "http://far:8088", net)


def test_the_system_resolver_and_route_lookup_on_this_host():
    assert "127.0.0.1" in node_settings.resolve_addresses("localhost")
    assert node_settings.route_source("127.0.0.1", 8088) == "127.0.0.1"
    assert node_settings.advertise_host(NMConfig(host="0.0.0.0"), "http://localhost:1") == "127.0.0.1"


# ---- loopback advertised to a remote RM -----------------------------------------------------------

def test_validate_rejects_a_loopback_address_for_a_remote_rm():
    net = FakeNet({"myhost": ["127.0.1.1"], "mixed": ["127.0.1.1", "10.0.0.5"]}, {"10.0.0.1": "10.0.0.5"})
    good = ClusterConfig(secret="s", rm_address="http://10.0.0.1:8088")

    def check(cfg: NMConfig) -> None:
        node_settings.validate(cfg, good, net.resolve, net.route)

    for adv in ("127.0.0.1", "127.0.1.1", "::1", "localhost", "myhost"):
        with pytest.raises(ConfigError, match=rf"advertise_host = '{adv}' is a loopback address but the RM at "
                                              r"http://10\.0\.0\.1:8088 is on another host: set advertise_host"):
            check(NMConfig(advertise_host=adv))
    with pytest.raises(ConfigError, match=r"advertise_host \(from host = '127.0.0.1'\) = '127.0.0.1'"):
        check(NMConfig(host="127.0.0.1"))
    check(NMConfig())                            # 0.0.0.0: the route's 10.0.0.5
    check(NMConfig(advertise_host="mixed"))      # not only loopback here: the benefit of the doubt
    check(NMConfig(advertise_host="10.0.0.5"))
    # The same loopback settings are right when the RM is on loopback too.
    node_settings.validate(NMConfig(advertise_host="127.0.0.1"), ClusterConfig(secret="s"), net.resolve, net.route)


def _conf(tmp_path: Path, rm: str, nm_toml: str = "") -> list[str]:
    nm, cluster = tmp_path / "nm.toml", tmp_path / "cluster.toml"
    nm.write_text("[nm]\n" + nm_toml)
    cluster.write_text(f'[cluster]\nsecret = "{SECRET}"\nrm_address = "{rm}"\n')
    return ["--config", str(nm), "--cluster-config", str(cluster), "--port", "0", "--local-dir",
            str(tmp_path / "l"), "--log-dir", str(tmp_path / "g"), "--recovery-dir", str(tmp_path / "r")]


def test_main_exits_2_naming_advertise_host_for_loopback_to_a_remote_rm(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ELASTANE_HOSTNAME", "no-such-override")
    args = _conf(tmp_path, "http://10.0.0.1:8088")
    assert nm_main([*args, "--advertise-host", "127.0.0.1"]) == 2
    err = capsys.readouterr().err
    assert ("advertise_host = '127.0.0.1' is a loopback address but the RM at http://10.0.0.1:8088 is on "
            "another host: set advertise_host (nm.toml, nm-<host>.toml or --advertise-host)") in err
    assert nm_main([*args, "--host", "127.0.0.1"]) == 2
    assert "from host = '127.0.0.1'" in capsys.readouterr().err
    # The host's override file is read by the daemon: its loopback advertise_host is refused too.
    monkeypatch.setenv("ELASTANE_HOSTNAME", "w3")
    (tmp_path / "nm-w3.toml").write_text('[nm]\nadvertise_host = "localhost"\n')
    assert nm_main(args) == 2
    assert "advertise_host = 'localhost' is a loopback address" in capsys.readouterr().err


# ---- the per-host override file ------------------------------------------------------------------

def test_host_override_file_overlays_nm_toml(tmp_path, monkeypatch):
    base = tmp_path / "nm.toml"
    base.write_text('[nm]\nadvertise_host = ""\nmemory_mb = 1000\nvcores = 2\nrack = "/r1"\n')
    (tmp_path / "nm-w3.toml").write_text('[nm]\nadvertise_host = "10.0.0.13"\nmemory_mb = 8192\n')
    cfg = pconfig.load_nm(str(base), hostname="w3")
    assert (cfg.advertise_host, cfg.memory_mb, cfg.vcores, cfg.rack) == ("10.0.0.13", 8192, 2, "/r1")
    # Another host, no file of its own: nm.toml as it is.
    other = pconfig.load_nm(str(base), hostname="w4")
    assert (other.advertise_host, other.memory_mb) == ("", 1000)
    # The hostname comes from $ELASTANE_HOSTNAME when set.
    monkeypatch.setenv("ELASTANE_HOSTNAME", "w3")
    assert pconfig.nm_hostname() == "w3"
    assert pconfig.load_nm(str(base)).memory_mb == 8192


def test_host_override_file_errors_name_the_file(tmp_path):
    base = tmp_path / "nm.toml"
    base.write_text("[nm]\n")
    bad = tmp_path / "nm-w3.toml"
    bad.write_text("[nm]\nadvertise_hots = \"10.0.0.13\"\n")
    with pytest.raises(ConfigError, match=r"nm-w3\.toml.*advertise_hots"):
        pconfig.load_nm(str(base), hostname="w3")
    bad.write_text("[nm]\nmemory_mb = \"lots\"\n")
    with pytest.raises(ConfigError, match=r"nm-w3\.toml.*memory_mb"):
        pconfig.load_nm(str(base), hostname="w3")
    bad.write_text("[node]\nmemory_mb = 1\n")
    with pytest.raises(ConfigError, match=r"nm-w3\.toml: only \[nm\].*node"):
        pconfig.load_nm(str(base), hostname="w3")
    # And nm.toml's own errors still name nm.toml.
    base.write_text("[nm]\nbogus = 1\n")
    with pytest.raises(ConfigError, match=r"nm\.toml.*bogus"):
        pconfig.load_nm(str(base), hostname="nobody")


# ---- the advertised address end to end: node id, node info, a container's NM_HOST -------------------

async def test_containers_and_node_info_get_the_advertised_address(tmp_path, monkeypatch):
    """An NM bound to 0.0.0.0 whose host override file advertises 127.0.0.2 (a loopback address
    other than the old default, reachable here): its node id, node info and containers use it."""
    rm = await FakeNodeRM().start()
    base = tmp_path / "nm"
    base.mkdir()
    nm_toml, cluster_toml = write_configs(base)
    (base / "nm-w3.toml").write_text('[nm]\nadvertise_host = "127.0.0.2"\n')
    monkeypatch.setenv("ELASTANE_HOSTNAME", "w3")
    ready = base / "ready.json"
    cmd = [sys.executable, "-m", "nodemanager", "--config", str(nm_toml), "--cluster-config", str(cluster_toml),
           "--rm-address", rm.url, "--host", "0.0.0.0", "--port", "0", "--memory-mb", "512", "--vcores", "1",
           "--local-dir", str(base / "local"), "--log-dir", str(base / "logs"),
           "--recovery-dir", str(base / "recovery"), "--cgroups", "off", "--heartbeat-interval-ms", "100",
           "--ready-file", str(ready)]
    with open(base / "nm.stderr", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
    client = NMClient(timeout_s=30)
    try:
        def ready_or_dead() -> bool:
            assert proc.poll() is None, (base / "nm.stderr").read_text()[-3000:]
            return ready.exists()
        await async_wait_until(ready_or_dead, 30, what="NM ready file")
        info = json.loads(ready.read_text())
        port = int(info["http_address"].rsplit(":", 1)[1])
        assert info["node_id"] == info["http_address"] == f"127.0.0.2:{port}"
        assert rm.registrations[0].node_id == info["node_id"]
        assert rm.registrations[0].http_address == info["http_address"]
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.2:{port}/ws/v1/node/info") as r:
                node = (await r.json(content_type=None))["nodeInfo"]
        assert (node["id"], node["nodeHostName"]) == (info["node_id"], "127.0.0.2")
        app, attempt, cid = new_ids()
        tok = container_token(info["node_id"], cid, app, attempt, 128, 1)
        out = base / "env.out"
        await client.start_container(info["http_address"], tok, LaunchContext(
            commands=[f"echo $NM_HOST $NM_HTTP_ADDRESS > {out}"], environment={}))

        async def done():
            st = await client.container_status(info["http_address"], cid, tok)
            return st if st.state == ContainerState.COMPLETE.value else None
        st = await async_wait_until(done, 30, interval_s=0.1, what=f"{cid} COMPLETE")
        assert st.exit_status == 0
        assert out.read_text().split() == ["127.0.0.2", f"127.0.0.2:{port}"]
    finally:
        await client.close()
        if proc.poll() is None:
            try:
                await stop_nm(NMProcess(proc, ready, {}, {"base": base}))
            except AssertionError:
                kill_nm(proc)
        await rm.stop()


# ---- a real check: each network namespace advertises its own address --------------------------------

NETNS_REASON = nn.netns_unavailable_reason()

CHOOSE = ("import sys; from nodemanager.node_settings import advertise_host; from protocol.config import NMConfig; "
          "print(advertise_host(NMConfig(host=sys.argv[1]), sys.argv[2]))")


@pytest.mark.skipif(NETNS_REASON is not None, reason=f"network namespaces unavailable: {NETNS_REASON}")
def test_each_namespace_advertises_its_own_address(tmp_path):
    """Two namespaces on a bridge stand for two hosts sharing one conf: with the RM on the bridge
    address each picks its own eth0 address; with the RM on loopback both keep 127.0.0.1."""
    net = nn.create(tmp_path / "net", nodes=2, bandwidth_bps=None)
    try:
        def choose(i: int, host: str, rm: str) -> str:
            r = subprocess.run([*net.exec_prefix(i), sys.executable, "-c", CHOOSE, host, rm], cwd=REPO,
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            return r.stdout.strip()

        rm = f"http://{net.bridge_ip}:8088"
        assert [choose(i, "0.0.0.0", rm) for i in range(2)] == [net.node_ip(0), net.node_ip(1)]
        assert choose(1, "::", rm) == net.node_ip(1)
        assert choose(0, "0.0.0.0", "http://127.0.0.1:8088") == "127.0.0.1"
    finally:
        assert nn.remove(net) == []
    assert nn.leftovers(net.tag) == []
