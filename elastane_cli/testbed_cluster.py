"""An Elastane cluster on the multi-host testbed, started the way operators start one.

    with TestbedCluster(base_dir, workers=3) as c:
        ... c.rm_url, c.testbed.kill_host("node2") ...

The testbed (elastane_cli.testbed_hosts) has a `master` host and `node1..nodeN`, each with its own
address, /tmp, hostname, sshd and optionally a CPU budget and a link cap. One conf dir on shared
storage (<base>/shared/conf, as an NFS-mounted conf/ would be) holds cluster.toml (a fresh secret,
`rm_address = http://master:8088`), rm.toml, nm.toml and the hosts file; nothing names an address
of a node: each NM finds its own. `bin/start-cluster` runs on the master host and reaches the
nodes over ssh; `bin/stop-cluster` stops them; `stop` then records what either left behind on
any host (processes, cgroup dirs) before the testbed is removed. Checkpoints and AM state go to
<base>/shared/checkpoints, which every host sees.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Sequence

import msgspec

from protocol import tokens
from protocol.ps_status import FINAL_STATUS_FILE, PsStatus, read_status

from .testbed_hosts import Testbed
from protocol.errors import HostError

PROJECT = Path(__file__).resolve().parent.parent
MASTER = "master"
RM_PORT = 8088
NM_PORT = 8042
AM_LABEL = "am"        # the master's NM label when it runs the AMs (am_host)


class TestbedClusterError(HostError, RuntimeError):
    """The cluster did not come up or go down as it should; the message carries the output and logs."""

    __test__ = False


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} to TOML")


def toml_section(section: str, values: Mapping[str, Any]) -> str:
    return f"[{section}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items())


class TestbedCluster:
    """An RM on the testbed's master host and an NM on each of `workers` node hosts.

    `worker_cpus` is each node host's CPU budget in cores (None: uncapped), `pin_cpus` pins each
    budgeted host to one of the machine's CPUs (testbed_hosts.pin_assignment), `bandwidth_bps` every
    host's link cap; `rm_conf` / `nm_conf` add [rm] / [nm] keys to the shared config;
    `node_conf` per node name adds keys to that host's own nm-<host>.toml; `queues` are rm.toml's
    capacity-scheduler queues (`[[queues]]` tables).

    `am_host=True` also runs an NM on the master (no CPU budget) labelled `AM_LABEL`, with
    `am_host_memory_mb` / `am_host_vcores`, and makes it the only place AMs go (rm.toml
    `am_node_label`; protocol/node_labels.py): the paper setups' master instance runs the jobs'
    masters outside the workers, so the node hosts' budgets hold executors only.
    """

    __test__ = False    # not a pytest test class

    def __init__(self, base_dir: Path, workers: int = 3, worker_cpus: float | None = None,
                 bandwidth_bps: int | None = None, node_memory_mb: int = 2048, node_vcores: int = 2,
                 nm_expiry_s: float = 4.0, am_expiry_s: float = 6.0, heartbeat_interval_ms: int = 250,
                 policy: str = "static", rm_conf: Mapping[str, Any] | None = None,
                 nm_conf: Mapping[str, Any] | None = None,
                 node_conf: Mapping[str, Mapping[str, Any]] | None = None, am_host: bool = False,
                 am_host_memory_mb: int = 8192, am_host_vcores: int = 16,
                 queues: Sequence[Mapping[str, Any]] = (), pin_cpus: bool = False) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.base_dir = Path(base_dir).resolve()
        self.workers = workers
        self.node_names = [f"node{i}" for i in range(1, workers + 1)]
        self.shared_dir = self.base_dir / "shared"
        self.testbed = Testbed(self.base_dir / "testbed", workers + 1, names=[MASTER, *self.node_names],
                               cpus=[None, *([worker_cpus] * workers)], bandwidth_bps=bandwidth_bps,
                               shared=[self.shared_dir], sshd=True, pin_cpus=pin_cpus)
        self.rm_conf: dict[str, Any] = {
            "nm_expiry_s": nm_expiry_s, "am_expiry_s": am_expiry_s,
            "nm_heartbeat_interval_ms": heartbeat_interval_ms, "policy": policy,
            "checkpoint_dir": f"file://{self.shared_dir / 'checkpoints'}", **(rm_conf or {})}
        self.nm_conf: dict[str, Any] = {
            "memory_mb": node_memory_mb, "vcores": node_vcores, "heartbeat_interval_ms": heartbeat_interval_ms,
            **(nm_conf or {})}
        # rm.toml's [[queues]] (name, capacity, max_capacity, ...); none: the one default queue.
        self.queues = [dict(q) for q in queues]
        self.node_conf = {k: dict(v) for k, v in (node_conf or {}).items()}
        unknown = sorted(set(self.node_conf) - {MASTER, *self.node_names})
        if unknown:
            raise ValueError(f"node_conf names hosts the testbed does not have: {unknown}")
        self.am_host = am_host
        if am_host:
            if am_host_memory_mb <= 0 or am_host_vcores <= 0:
                raise ValueError(f"the AM host needs memory and vcores > 0, got {am_host_memory_mb} MB, "
                                 f"{am_host_vcores} vcores")
            self.rm_conf.setdefault("node_labels", [AM_LABEL])
            self.rm_conf.setdefault("am_node_label", AM_LABEL)
            self.node_conf[MASTER] = {"memory_mb": am_host_memory_mb, "vcores": am_host_vcores,
                                      "node_labels": [AM_LABEL], **self.node_conf.get(MASTER, {})}
        self.secret = ""
        self.start_output = ""
        self.stop_output = ""
        self.stop_returncode: int | None = None
        self.leftovers: dict[str, list[str]] = {}   # host -> processes / cgroup dirs left after stop
        self.leftover_logs = ""     # the daemons' log tails when something was left (the logs go with the testbed)
        self._started = False

    # ----- paths and addresses ------------------------------------------------------------------

    @property
    def conf_dir(self) -> Path:
        return self.shared_dir / "conf"

    @property
    def hosts_file(self) -> Path:
        return self.conf_dir / "workers"

    @property
    def nm_hosts(self) -> list[str]:
        """The hosts that run an NM: the nodes, and the master when it runs the AMs."""
        return [MASTER, *self.node_names] if self.am_host else list(self.node_names)

    @property
    def rm_url(self) -> str:
        """The RM as the test process (outside every host) reaches it: the master's address."""
        return f"http://{self.testbed.host(MASTER).ip}:{RM_PORT}"

    def node_id(self, name: str) -> str:
        return f"{self.testbed.host(name).ip}:{NM_PORT}"

    def host_of(self, address: str) -> str:
        """The testbed host whose address `address` (host or host:port) is."""
        ip = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
        for h in self.testbed.hosts:
            if h.ip == ip or h.name == ip:
                return h.name
        raise KeyError(f"no testbed host has address {address!r}")

    def env(self) -> dict[str, str]:
        """What an operator's shell on the master has set: the shared conf dir and the ssh options,
        and the interpreter the daemons run (`ELASTANE_PYTHON`, carried to every host over ssh by
        bin/start-cluster) when this process has one set."""
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": os.environ.get("HOME", "/root"),
               "LANG": "C.UTF-8", "ELASTANE_CONF_DIR": str(self.conf_dir),
               "ELASTANE_SSH_OPTS": self.testbed.ssh_opts()}
        if os.environ.get("ELASTANE_PYTHON"):
            env["ELASTANE_PYTHON"] = os.environ["ELASTANE_PYTHON"]
        return env

    # ----- start / stop -------------------------------------------------------------------------

    def write_conf(self) -> None:
        """The shared conf/ every host reads, and the hosts file (node names, not addresses)."""
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.shared_dir / "checkpoints").mkdir(exist_ok=True)
        self.secret = tokens.generate_secret()
        cluster = self.conf_dir / "cluster.toml"
        cluster.write_text(toml_section("cluster", {"secret": self.secret,
                                                    "rm_address": f"http://{MASTER}:{RM_PORT}"}))
        os.chmod(cluster, 0o600)
        (self.conf_dir / "rm.toml").write_text(toml_section("rm", self.rm_conf) + "".join(
            "\n" + toml_section("[queues]", q) for q in self.queues))
        (self.conf_dir / "nm.toml").write_text(toml_section("nm", self.nm_conf))
        for name, values in self.node_conf.items():
            (self.conf_dir / f"nm-{name}.toml").write_text(toml_section("nm", values))
        self.hosts_file.write_text("# the workers: one NM each\n" + "".join(f"{n}\n" for n in self.nm_hosts))

    def start(self, timeout_s: float = 120.0) -> "TestbedCluster":
        """Build the hosts, write the conf, run bin/start-cluster on the master; return once every
        node is RUNNING at the RM."""
        deadline = time.monotonic() + timeout_s
        try:
            self.testbed.create()
            self._started = True
            self.write_conf()
            r = self.testbed.run(MASTER, [str(PROJECT / "bin" / "start-cluster"), str(self.hosts_file)],
                                 env=self.env(), timeout=max(10.0, deadline - time.monotonic()))
            self.start_output = r.stdout + r.stderr
            if r.returncode != 0:
                raise TestbedClusterError(f"bin/start-cluster exited {r.returncode}:\n{self.start_output}\n"
                                          + self.logs())
            self.await_nodes_running(self.nm_hosts, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def nodes(self) -> list[dict[str, Any]]:
        """The RM's node list (its REST API)."""
        with urllib.request.urlopen(self.rm_url + "/ws/v1/cluster/nodes", timeout=5) as r:
            body = json.loads(r.read())
        return ((body or {}).get("nodes") or {}).get("node") or []

    def await_nodes_running(self, names: Sequence[str], deadline: float) -> None:
        want = {self.node_id(n) for n in names}
        states: dict[str, str] = {}
        while True:
            try:
                states = {str(n.get("id")): str(n.get("state")) for n in self.nodes()}
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if all(states.get(nid) == "RUNNING" for nid in want):
                return
            if time.monotonic() > deadline:
                raise TestbedClusterError(f"nodes not RUNNING at the RM (want {sorted(want)}, have {states})\n"
                                          + self.logs())
            time.sleep(0.1)

    def stop(self) -> None:
        """bin/stop-cluster on the master, then note what is left on each host, then remove the
        testbed (which kills anything still there)."""
        if not self._started:
            self.testbed.remove()
            return
        self._started = False
        master = self.testbed.host(MASTER)
        if master.anchor_pid:
            try:
                r = self.testbed.run(MASTER, [str(PROJECT / "bin" / "stop-cluster"), str(self.hosts_file)],
                                     env=self.env(), timeout=120)
                self.stop_returncode = r.returncode
                self.stop_output = r.stdout + r.stderr
            except subprocess.TimeoutExpired as e:
                self.stop_output = f"bin/stop-cluster timed out: {e}"
        for h in self.testbed.hosts:
            if not h.anchor_pid:
                continue  # a killed host: nothing of it runs any more
            left = [f"pid {p} {_cmdline(p)}" for p in self.testbed.service_pids(h.name)]
            left += [f"cgroup {d}" for d in self.testbed.cgroup_dirs(h.name)]
            if left:
                self.leftovers[h.name] = left
        if self.leftovers:
            self.leftover_logs = self.logs(25)
        self.testbed.remove()

    def stop_report(self) -> str:
        """What a test prints when the stop left something: stop-cluster's output and the logs' tails."""
        return (f"left on the hosts after bin/stop-cluster: {self.leftovers}\n"
                f"bin/stop-cluster (exit {self.stop_returncode}):\n{self.stop_output}\n{self.leftover_logs}")

    def final_status(self, app_id: str) -> PsStatus:
        """A PS job's final status, which its AM writes on exit into its dir on the shared storage
        (`<checkpoint_dir>/<app id>/status.json`); an empty PsStatus (every field its default) if it
        cannot be read."""
        try:
            return read_status((self.shared_dir / "checkpoints" / app_id / FINAL_STATUS_FILE).read_bytes())
        except (OSError, msgspec.DecodeError):
            return PsStatus()

    def am_logs(self, app_id: str, lines: int = 40) -> list[str]:
        """The tail of the stderr of the app's AM containers (every attempt), on whichever host
        ran them and is still there, each headed by its host and path."""
        out: list[str] = []
        for h in self.testbed.hosts:
            for log in sorted((h.tmp_dir / "elastane" / "nm" / "logs" / app_id).glob("container_*_000001/stderr")):
                out += [f"--- {h.name}: {log}", *log.read_text(errors="replace").splitlines()[-lines:]]
        return out

    def logs(self, lines: int = 40) -> str:
        """The tail of every daemon log on every host (they are in the hosts' own /tmp)."""
        out = []
        for h in self.testbed.hosts:
            for log in sorted((h.tmp_dir / "elastane" / "logs").glob("*.log")):
                text = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {h.name}: {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    def __enter__(self) -> "TestbedCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"
