"""An HA Elastane cluster on the multi-host testbed: etcd on its own host, two RM hosts, NM hosts.

    c = HaTestbedCluster(base_dir, nodes=2).start()
    ... c.active_id(), c.testbed.kill_host("rm1"), c.revive_rm_host("rm1"), c.stop_etcd() ...
    c.stop()

TestbedCluster's conf and NMs (elastane_cli.testbed_cluster), with etcd (one member) on the host
`etcd` and the RM hosts `rm1` and `rm2` listed in cluster.toml's [ha] with the documented default
lease, client failover and NM / AM expiries (instead of the one `master`). `bin/start-cluster` runs on rm1:
rm1 there, rm2 over ssh, then the NMs over ssh; the RMs elect the active one on etcd. An RM host
that died comes back as a rebooted host does (`revive_rm_host`: its disk kept, its processes
gone), and its RM is started by the operator's script (`bin/start-rm` with the RM's id). `stop`
runs bin/stop-cluster from a surviving RM host, stops etcd, notes what is left on each host and
removes the testbed; `leftovers` lists anything found.

bench/rm_failover.py and tests/cluster/test_rm_ha_testbed.py build their clusters with it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, TypeVar

from protocol import tokens
from protocol.config import RMConfig

from . import node_network
from .testbed_cluster import PROJECT, RM_PORT, TestbedCluster, TestbedClusterError, toml_section
from .testbed_hosts import Testbed

T = TypeVar("T")
RM_HOSTS = ("rm1", "rm2")
ETCD_HOST = "etcd"
ETCD_PORT = 2379
LAUNCHED = re.compile(r"launched (container_\S+) pid \d+")
REFUSED = re.compile(r"container (container_\S+) was already started on this node")


def wait_for(cond: Callable[[], Optional[T]], timeout_s: float, what: str, poll_s: float = 0.05) -> T:
    """Poll `cond` until it returns something truthy (returned); TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


def get(url: str, timeout_s: float = 2.0) -> Optional[dict[str, Any]]:
    """A JSON GET: None when nothing answers or the answer is an error (a standby's 503 included)."""
    try:
        with urllib.request.urlopen(f"{url}{'&' if '?' in url else '?'}user.name=bench", timeout=timeout_s) as r:
            body = json.loads(r.read() or b"{}")
            return body if isinstance(body, dict) else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def duplicate_container_ids(nm_logs: Iterable[str]) -> tuple[int, list[str], int]:
    """(count, ids) of container ids launched more than once across all the NMs' logs, or refused
    by an NM because the id had already started there; and how many distinct ids were launched
    (so that a count of 0 is seen to come from logs that name launches at all)."""
    launches: Counter[str] = Counter()
    refused: set[str] = set()
    for text in nm_logs:
        launches.update(LAUNCHED.findall(text))
        refused.update(REFUSED.findall(text))
    dups = sorted({c for c, n in launches.items() if n > 1} | refused)
    return len(dups), dups, len(launches)


class HaTestbedCluster(TestbedCluster):
    """TestbedCluster's conf and NMs, with etcd on its own host and two RM hosts listed in [ha]
    (instead of the one `master`): `bin/start-cluster` on rm1 starts both RMs and the NMs."""

    __test__ = False

    def __init__(self, base_dir: Path, nodes: int, **kw: Any) -> None:
        # The RM's documented NM and AM expiries (rm.toml's defaults) unless given, not
        # TestbedCluster's shorter ones: after a failover every NM and AM has to be heard from by
        # the new active within them, which is what an operator's cluster does.
        defaults = RMConfig()
        kw.setdefault("nm_expiry_s", defaults.nm_expiry_s)
        kw.setdefault("am_expiry_s", defaults.am_expiry_s)
        super().__init__(base_dir, workers=nodes, **kw)
        self.testbed = Testbed(self.base_dir / "testbed", nodes + 3, names=[*RM_HOSTS, ETCD_HOST, *self.node_names],
                               shared=[self.shared_dir], sshd=True)
        self.etcd: Optional[subprocess.Popen[bytes]] = None

    # ----- addresses and roles ------------------------------------------------------------------

    def rm_address(self, rm_id: str) -> str:
        """An RM's URL from outside the hosts (the bridge), by its host's address."""
        return f"http://{self.testbed.host(rm_id).ip}:{RM_PORT}"

    @property
    def etcd_url(self) -> str:
        return f"http://{self.testbed.host(ETCD_HOST).ip}:{ETCD_PORT}"

    def ha_info(self, rm_id: str) -> dict[str, Any]:
        """The RM's /ws/v1/cluster/info clusterInfo ({} when it does not answer 200)."""
        info = (get(self.rm_address(rm_id) + "/ws/v1/cluster/info") or {}).get("clusterInfo")
        return info if isinstance(info, dict) else {}

    def active_id(self) -> Optional[str]:
        """The RM that answers as ACTIVE, None when none does."""
        for rm_id in RM_HOSTS:
            if self.testbed.host(rm_id).anchor_pid and self.ha_info(rm_id).get("haState") == "ACTIVE":
                return rm_id
        return None

    @property
    def rm_url(self) -> str:     # TestbedCluster's node checks ask the active RM
        return self.rm_address(self.active_id() or RM_HOSTS[0])

    def rm_log(self, rm_id: str) -> str:
        """The RM daemon's log on its host (elastane-daemon names it by the RM's id), "" if none."""
        logs = sorted((self.testbed.host(rm_id).tmp_dir / "elastane" / "logs").glob(f"*-rm-{rm_id}-*.log"))
        return "".join(p.read_text(errors="replace") for p in logs)

    # ----- start / stop -------------------------------------------------------------------------

    def write_conf(self) -> None:
        super().write_conf()
        self.secret = tokens.generate_secret()
        addresses = ", ".join(f'{i} = "http://{i}:{RM_PORT}"' for i in RM_HOSTS)
        cluster = self.conf_dir / "cluster.toml"
        # The documented defaults for the lease and the clients' failover (no lease_s etc. here).
        cluster.write_text(toml_section("cluster", {"secret": self.secret, "rm_address": f"http://{RM_HOSTS[0]}:{RM_PORT}"})
                           + "\n" + toml_section("ha", {"enabled": True, "rm_ids": list(RM_HOSTS),
                                                        "etcd_endpoints": [f"http://{ETCD_HOST}:{ETCD_PORT}"]})
                           + f"rm_addresses = {{ {addresses} }}\n")
        os.chmod(cluster, 0o600)

    def start_etcd(self, timeout_s: float) -> None:
        """etcd on its host; again after `stop_etcd`, on the same data dir (its keys and revisions kept)."""
        h = self.testbed.host(ETCD_HOST)
        binary = shutil.which("etcd")
        if binary is None:
            raise TestbedClusterError("no etcd binary (Debian's etcd-server; bin/ensure-test-packages installs it)")
        client, peer = self.etcd_url, f"http://{h.ip}:{ETCD_PORT + 1}"
        with open(h.tmp_dir / "etcd.log", "ab") as out:
            self.etcd = subprocess.Popen(
                [*h.exec_prefix(), binary, "--name", "e1", "--data-dir", "/tmp/etcd-data",
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"e1={peer}", "--initial-cluster-state", "new"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def healthy() -> bool:
            if self.etcd is not None and self.etcd.poll() is not None:
                raise TestbedClusterError(f"etcd exited {self.etcd.returncode}: "
                                          + (h.tmp_dir / "etcd.log").read_text(errors="replace")[-2000:])
            return str((get(client + "/health") or {}).get("health")) == "true"
        wait_for(healthy, timeout_s, "etcd to answer", 0.1)

    def stop_etcd(self, sig: int = signal.SIGTERM) -> Optional[int]:
        """Stop the etcd member (SIGTERM: a clean stop; SIGKILL: it dies) and reap it; its exit code."""
        if self.etcd is None or self.etcd.poll() is not None:
            return None if self.etcd is None else self.etcd.returncode
        self.etcd.send_signal(sig)
        try:
            return self.etcd.wait(30)
        except subprocess.TimeoutExpired:
            self.etcd.kill()
            return self.etcd.wait(10)

    def start_rm(self, rm_id: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """The operator's start of one RM on its own host: `bin/start-rm` with the RM's id and its
        listed port, as bin/start-cluster's on_rms runs it (it returns once the RM is ready)."""
        env = {**self.env(), "ELASTANE_RM_ID": rm_id, "ELASTANE_RM_PORT": str(RM_PORT)}
        return self.testbed.run(rm_id, [str(PROJECT / "bin" / "start-rm")], env=env, timeout=timeout_s)

    def revive_rm_host(self, rm_id: str) -> subprocess.CompletedProcess[str]:
        """A killed RM host comes back (its disk as it was, nothing of it running) and the operator
        starts its RM again."""
        self.testbed.revive_host(rm_id)
        return self.start_rm(rm_id)

    def start(self, timeout_s: float = 180.0) -> "HaTestbedCluster":
        deadline = time.monotonic() + timeout_s
        try:
            self.testbed.create()
            self._started = True
            self.write_conf()
            self.start_etcd(timeout_s)
            r = self.testbed.run(RM_HOSTS[0], [str(PROJECT / "bin" / "start-cluster"), str(self.hosts_file)],
                                 env=self.env(), timeout=max(10.0, deadline - time.monotonic()))
            self.start_output = r.stdout + r.stderr
            if r.returncode != 0:
                raise TestbedClusterError(f"bin/start-cluster exited {r.returncode}:\n{self.start_output}\n" + self.logs())
            wait_for(self.active_id, max(1.0, deadline - time.monotonic()), "an active RM", 0.1)
            self.await_nodes_running(self.nm_hosts, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """bin/stop-cluster on a surviving RM host, etcd stopped, what is left noted, the testbed removed."""
        if not self._started:
            self.testbed.remove()
            return
        self._started = False
        alive = [i for i in RM_HOSTS if self.testbed.host(i).anchor_pid]
        if alive:
            try:
                r = self.testbed.run(alive[0], [str(PROJECT / "bin" / "stop-cluster"), str(self.hosts_file)],
                                     env=self.env(), timeout=180)
                self.stop_returncode, self.stop_output = r.returncode, r.stdout + r.stderr
            except subprocess.TimeoutExpired as e:
                self.stop_output = f"bin/stop-cluster timed out: {e}"
        self.stop_etcd()
        for h in self.testbed.hosts:
            if not h.anchor_pid:
                continue
            left = [f"pid {p}" for p in self.testbed.service_pids(h.name)]
            left += [f"cgroup {d}" for d in self.testbed.cgroup_dirs(h.name)]
            if left:
                self.leftovers[h.name] = left
        self.testbed.remove()

    def left_behind(self, dead: Optional[str]) -> list[str]:
        """After `stop`: every process, cgroup dir, network device or error left, and a failed
        bin/stop-cluster (other than its naming the dead RM host `dead`, whose sshd is gone)."""
        out = [f"{h}: {x}" for h, xs in self.leftovers.items() for x in xs]
        failed_dead = dead is not None and re.search(rf"failed for the ResourceManager\(s\): {dead}\s*$",
                                                     self.stop_output, re.M)
        if self.stop_returncode not in (None, 0) and not failed_dead:
            out.append(f"bin/stop-cluster exited {self.stop_returncode}: {self.stop_output.strip()[-300:]}")
        tb = self.testbed
        out += [f"net {n}" for n in node_network.leftovers(node_network.cluster_tag(tb.base_dir))]
        out += [f"pid {p} (killed by remove)" for p in tb.leftover_pids] + [f"error {e}" for e in tb.errors]
        return out

    # ----- logs ---------------------------------------------------------------------------------

    def nm_logs(self) -> list[str]:
        """Every NM daemon log on every node host (read while the hosts' dirs are still there)."""
        out = []
        for name in self.node_names:
            for p in sorted((self.testbed.host(name).tmp_dir / "elastane" / "logs").glob("*-nm-*.log")):
                out.append(p.read_text(errors="replace"))
        return out

    def am_stderr(self) -> list[str]:
        out = []
        for name in self.node_names:
            for p in (self.testbed.host(name).tmp_dir / "elastane" / "nm" / "logs").glob("*/container_*/stderr"):
                out.append(p.read_text(errors="replace"))
        return out
