"""A whole Elastane cluster on localhost: one RM and N NMs as real processes on real sockets.

Synchronous and subprocess-based so pytest fixtures, the CLI (`elastane cluster start`), the demo
and the benchmarks all use it the same way:

    with LocalCluster(tmp_path, nodes=3) as c:
        ... c.rm_url ...

Layout under `base_dir`: conf/cluster.toml (fresh secret), rm/ (state dir), nm<i>/{local,logs,
recovery}/, logs/{rm,nm<i>}.log (daemon output), run/*.ready (ready files) and cluster.json
(pids, so another process can stop the cluster: `LocalCluster.load(base_dir).stop()`).

With `node_bandwidth` or `node_cpus` each node is a host of the multi-host testbed
(elastane_cli.testbed_hosts, docs/testbed.md; "netns" mode): every NM and its containers run
in the host's own network namespace behind a veth on a bridge (tc-capped with `node_bandwidth`),
with its own /tmp and hostname and, with `node_cpus`, inside a cgroup holding that many cores;
the RM binds 0.0.0.0 and advertises the bridge address. In "emulated" mode (bandwidth only) the
NMs tell their containers the cap and the data plane paces itself.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

import msgspec

from protocol import durable_storage, tokens
from psruntime.wire.bandwidth import parse_rate

from . import container_reaper, node_network, processes, testbed_hosts
from protocol.errors import HostError
from protocol.json_types import JsonObject


class ClusterStartError(HostError, RuntimeError):
    """The cluster did not come up; the message carries the failing daemons' log tails."""


def _path_hook(typ: type, value: object) -> object:
    """msgspec's decoding of the types it does not know: a Path from its string."""
    if typ is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError(f"cannot decode {typ}")


@dataclass
class NodeProcess:
    """One NodeManager process of a LocalCluster and its directories."""

    index: int
    pid: int
    node_id: str
    http_address: str
    base_dir: Path
    log_dir: Path
    local_dir: Path
    recovery_dir: Path
    start_ticks: int | None = None
    alive: bool = True

    def to_json(self) -> JsonObject:
        out: JsonObject = msgspec.to_builtins(self, enc_hook=str)    # the dirs as strings
        return out

    @classmethod
    def from_json(cls, d: object) -> "NodeProcess":
        """`to_json`'s object read back (msgspec.ValidationError naming a bad field)."""
        return msgspec.convert(d, cls, dec_hook=_path_hook)


@dataclass
class _Spawned:
    popen: subprocess.Popen | None
    log: IO[bytes] | None = field(default=None, repr=False)


class LocalCluster:
    """One RM and `nodes` NMs on 127.0.0.1, each NM declaring `node_memory_mb` / `node_vcores`."""

    STATE_FILE = "cluster.json"
    # The daemons' modules; tests point these at fakes to exercise the harness on its own.
    rm_module = "rm"
    nm_module = "nodemanager"

    def __init__(self, base_dir: Path, nodes: int = 3, node_memory_mb: int = 2048, node_vcores: int = 2,
                 rm_port: int = 0, nm_expiry_s: float = 10.0, am_expiry_s: float = 10.0,
                 heartbeat_interval_ms: int = 1000, cgroups: str = "auto", policy: str = "static",
                 extra_rm_args: Sequence[str] = (), extra_nm_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, node_bandwidth: str | int | None = None,
                 network: str = "auto", node_cpus: float | None = None,
                 cluster_settings: Mapping[str, str] | None = None) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        if node_memory_mb < 1 or node_vcores < 1:
            raise ValueError("node_memory_mb and node_vcores must be positive")
        if not 0 <= rm_port <= 65535:
            raise ValueError(f"rm_port must be in 0..65535, got {rm_port}")
        if network not in node_network.MODES:
            raise ValueError(f"network must be one of {', '.join(node_network.MODES)}, got {network!r}")
        self.node_bandwidth_bps = parse_rate(node_bandwidth) if node_bandwidth is not None else None
        if network == "emulated" and self.node_bandwidth_bps is None:
            raise ValueError("network='emulated' needs node_bandwidth (e.g. '1gbit')")
        if node_cpus is not None and node_cpus <= 0:
            raise ValueError(f"node_cpus must be > 0 cores, got {node_cpus}")
        if node_cpus is not None and network == "emulated":
            raise ValueError("node_cpus needs network='netns' or 'auto' (a CPU budget is a host's cgroup)")
        if network == "netns" and nodes > node_network.MAX_NODES:
            raise ValueError(f"network='netns' allows at most {node_network.MAX_NODES} nodes, got {nodes}")
        self.network = network
        self.network_mode = ""               # resolved at start: netns | emulated | none
        self.node_cpus = node_cpus
        self.hosts: testbed_hosts.Testbed | None = None   # netns mode: one testbed host per node
        self.net: node_network.ClusterNetwork | None = None
        self.network_errors: list[str] = []  # what teardown could not remove
        self.base_dir = Path(base_dir).resolve()
        self.num_nodes = nodes
        self.node_memory_mb = node_memory_mb
        self.node_vcores = node_vcores
        self.rm_port = rm_port
        self.nm_expiry_s = nm_expiry_s
        self.am_expiry_s = am_expiry_s
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.cgroups = cgroups
        self.policy = policy
        self.extra_rm_args = list(extra_rm_args)
        self.extra_nm_args = list(extra_nm_args)
        self.env = dict(env or {})
        # More [cluster] keys of conf/cluster.toml (string values), e.g. remote_app_log_dir.
        self.cluster_settings = dict(cluster_settings or {})
        self.rm_url = ""
        self.secret = ""
        self.nodes: list[NodeProcess] = []
        self.rm_pid = 0
        self.rm_start_ticks: int | None = None
        self.started_at = 0.0
        self._spawned: dict[str, _Spawned] = {}
        self._stopped = False

    # ----- paths ------------------------------------------------------------------------------

    @property
    def conf_path(self) -> Path:
        return self.base_dir / "conf" / "cluster.toml"

    def log_path(self, name: str) -> Path:
        return self.base_dir / "logs" / f"{name}.log"

    def _ready_path(self, name: str) -> Path:
        return self.base_dir / "run" / f"{name}.ready"

    # ----- start ------------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> "LocalCluster":
        """Start the RM, then every NM; return once every node is RUNNING at the RM."""
        deadline = time.monotonic() + timeout_s
        for sub in ("conf", "rm", "logs", "run"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)
        self.started_at = time.time()
        self._stopped = False
        self.secret = tokens.generate_secret()
        self._write_cluster_conf(f"http://127.0.0.1:{self.rm_port or 8088}")
        try:
            self._setup_network()
            rm_ready = self._start_rm(deadline)
            self.rm_url = rm_ready.get("url") or f"http://{rm_ready['http_address']}"
            self._write_cluster_conf(self.rm_url)
            self.save_state()
            for i in range(self.num_nodes):
                self._spawn_nm(i)
            for i in range(self.num_nodes):
                self._await_nm(i, deadline)
            self.save_state()
            self._await_nodes_running(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _setup_network(self) -> None:
        """Resolve the network mode; in netns mode build the bridge and namespaces (recorded at once,
        so a crash before the end leaves cluster.json naming them for `stop`)."""
        try:
            self.network_mode = node_network.resolve_mode(
                "netns" if self.node_cpus and self.network == "auto" else self.network, self.node_bandwidth_bps)
        except node_network.NodeNetworkError as e:
            raise ClusterStartError(str(e)) from None
        if self.network_mode == "netns":
            self.hosts = testbed_hosts.Testbed(self.base_dir / "hosts", self.num_nodes,
                                               names=[f"nm{i}" for i in range(self.num_nodes)],
                                               cpus=self.node_cpus, bandwidth_bps=self.node_bandwidth_bps,
                                               shared=[self.base_dir])
            try:
                self.hosts.create()
            except (testbed_hosts.TestbedError, node_network.NodeNetworkError) as e:
                raise ClusterStartError(f"cannot build the node hosts: {e}") from None
            self.net = self.hosts.net
            assert self.net is not None
            self.save_state()
            self._write_daemon_conf("rm.toml", "rm", "advertise_host", f'"{self.net.bridge_ip}"')
        elif self.network_mode == "emulated":
            self._write_daemon_conf("nm.toml", "nm", "network_bandwidth_bps", str(self.node_bandwidth_bps))

    def _write_daemon_conf(self, name: str, section: str, key: str, value: str) -> None:
        """A daemon config file holding only what this cluster changes (the rest stays default)."""
        (self.base_dir / "conf" / name).write_text(
            f"# Written by LocalCluster (network mode {self.network_mode}).\n[{section}]\n{key} = {value}\n")

    def _daemon_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _write_cluster_conf(self, rm_address: str) -> None:
        text = ("# Written by LocalCluster: this cluster's own secret and RM address.\n"
                "[cluster]\n"
                f'secret = "{self.secret}"\n'
                f'rm_address = "{rm_address}"\n'
                + "".join(f"{k} = {json.dumps(v)}\n" for k, v in self.cluster_settings.items()))
        # durable (the cluster's secret), 0600 from the first byte
        durable_storage.write_atomic(self.conf_path, text.encode(), mode=0o600)

    def _spawn(self, name: str, args: list[str], prefix: Sequence[str] = ()) -> subprocess.Popen:
        self._ready_path(name).unlink(missing_ok=True)
        log = open(self.log_path(name), "ab")
        # Own session: the daemons outlive the CLI that started them and miss its Ctrl-C.
        p = subprocess.Popen([*prefix, sys.executable, *args], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, env=self._daemon_env(), cwd=self.base_dir,
                             start_new_session=True)
        self._spawned[name] = _Spawned(p, log)
        return p

    def _await_ready(self, name: str, deadline: float) -> dict[str, Any]:
        """Poll the daemon's ready file; fail fast if the daemon exits first."""
        path = self._ready_path(name)
        popen = self._spawned[name].popen
        while True:
            if path.exists():
                try:
                    return json.loads(path.read_text())
                except ValueError:
                    pass  # written atomically, so only a foreign writer gets here; retry
            if popen is not None and popen.poll() is not None:
                raise ClusterStartError(f"{name} exited with code {popen.returncode} before it was ready:\n"
                                        + processes.tail(self.log_path(name)))
            if time.monotonic() > deadline:
                raise ClusterStartError(f"{name} was not ready in time; log tail:\n"
                                        + processes.tail(self.log_path(name)))
            time.sleep(0.05)

    def _start_rm(self, deadline: float) -> dict[str, Any]:
        # In netns mode NMs reach the RM over the bridge: bind everywhere, advertise the bridge address.
        host, conf = ("0.0.0.0", ["--config", str(self.base_dir / "conf" / "rm.toml")]) if self.net else ("127.0.0.1", [])
        args = ["-m", self.rm_module, *conf, "--cluster-config", str(self.conf_path), "--host", host,
                "--port", str(self.rm_port), "--state-dir", str(self.base_dir / "rm"),
                "--nm-expiry-s", str(self.nm_expiry_s), "--am-expiry-s", str(self.am_expiry_s),
                # The NMs heartbeat at the RM's period (its answers carry it): the cluster's one setting.
                "--nm-heartbeat-interval-ms", str(self.heartbeat_interval_ms),
                "--policy", self.policy, "--ready-file", str(self._ready_path("rm")), *self.extra_rm_args]
        p = self._spawn("rm", args)
        self.rm_pid = p.pid
        self.rm_start_ticks = processes.proc_start_ticks(p.pid)
        return self._await_ready("rm", deadline)

    def _node_dirs(self, i: int) -> NodeProcess:
        base = self.base_dir / f"nm{i}"
        node = NodeProcess(index=i, pid=0, node_id="", http_address="", base_dir=base,
                           log_dir=base / "logs", local_dir=base / "local", recovery_dir=base / "recovery")
        for d in (node.log_dir, node.local_dir, node.recovery_dir):
            d.mkdir(parents=True, exist_ok=True)
        return node

    def _spawn_nm(self, i: int, port: int = 0) -> None:
        node = self._node_dirs(i)
        conf = ["--config", str(self.base_dir / "conf" / "nm.toml")] if self.network_mode == "emulated" else []
        host = self.net.node_ip(i) if self.net else "127.0.0.1"
        args = ["-m", self.nm_module, *conf, "--cluster-config", str(self.conf_path), "--rm-address", self.rm_url,
                "--host", host, "--port", str(port), "--memory-mb", str(self.node_memory_mb),
                "--vcores", str(self.node_vcores), "--local-dir", str(node.local_dir),
                "--log-dir", str(node.log_dir), "--recovery-dir", str(node.recovery_dir),
                "--cgroups", self.cgroups, "--heartbeat-interval-ms", str(self.heartbeat_interval_ms),
                "--ready-file", str(self._ready_path(f"nm{i}")), *self.extra_nm_args]
        p = self._spawn(f"nm{i}", args, self.hosts.host(i).exec_prefix() if self.hosts else ())
        node.pid = p.pid
        node.start_ticks = processes.proc_start_ticks(p.pid)
        if i < len(self.nodes):
            self.nodes[i] = node
        else:
            self.nodes.append(node)

    def _await_nm(self, i: int, deadline: float) -> None:
        ready = self._await_ready(f"nm{i}", deadline)
        self.nodes[i].node_id = ready["node_id"]
        self.nodes[i].http_address = ready["http_address"]

    def _rm_nodes(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.rm_url + "/ws/v1/cluster/nodes", timeout=5) as r:
            body = json.loads(r.read())
        return ((body or {}).get("nodes") or {}).get("node") or []

    def _await_nodes_running(self, deadline: float, indexes: Sequence[int] | None = None) -> None:
        want = {self.nodes[i].node_id for i in (indexes if indexes is not None else range(len(self.nodes)))}
        states: dict[str | None, str | None] = {}
        while True:
            try:
                states = {n.get("id"): n.get("state") for n in self._rm_nodes()}
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if all(states.get(nid) == "RUNNING" for nid in want):
                return
            dead = [n for n in self.nodes if n.node_id in want and not processes.is_alive(n.pid)]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- nm{n.index}:\n{processes.tail(self.log_path(f'nm{n.index}'))}"
                                 for n in self.nodes if n.node_id in want)
                raise ClusterStartError(
                    f"nodes not RUNNING at the RM (states {states}); rm log:\n"
                    f"{processes.tail(self.log_path('rm'))}\n{logs}")
            time.sleep(0.05)

    # ----- failures ---------------------------------------------------------------------------

    def kill_node(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Signal NM `index`; with SIGKILL its containers keep running, like on a crashed host."""
        node = self.nodes[index]
        processes.signal_pid(node.pid, sig, node.start_ticks)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            spawned = self._spawned.get(f"nm{index}")
            if spawned is not None and spawned.popen is not None:
                try:
                    spawned.popen.wait(timeout=20)  # reap, so the pid is really gone
                except subprocess.TimeoutExpired:
                    pass
            processes.wait_gone([(node.pid, node.start_ticks)], 20.0)
            node.alive = processes.is_alive(node.pid, node.start_ticks)
        self.save_state()

    def restart_node(self, index: int, timeout_s: float = 60.0) -> None:
        """Start NM `index` again after `kill_node`, on its directories and its port (so under its
        node id, as a rebooted host's NM comes back); returns once it is RUNNING at the RM."""
        node = self.nodes[index]
        if processes.is_alive(node.pid, node.start_ticks):
            raise RuntimeError(f"nm{index} (pid {node.pid}) is still running")
        old = self._spawned.pop(f"nm{index}", None)
        if old is not None and old.log is not None:
            old.log.close()
        deadline = time.monotonic() + timeout_s
        self._spawn_nm(index, port=int(node.http_address.rsplit(":", 1)[1]))
        self._await_nm(index, deadline)
        self.save_state()
        self._await_nodes_running(deadline, [index])

    # ----- stop -------------------------------------------------------------------------------

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the NMs then the RM, SIGKILL stragglers, then reap containers left behind."""
        if self._stopped:
            return
        nms = [(n.pid, n.start_ticks) for n in self.nodes if n.pid]
        processes.terminate_all(nms, timeout_s)
        if self.rm_pid:
            processes.terminate_all([(self.rm_pid, self.rm_start_ticks)], timeout_s)
        for spawned in self._spawned.values():
            if spawned.popen is not None:
                try:
                    spawned.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            if spawned.log is not None:
                spawned.log.close()
        self._spawned.clear()
        if self.started_at:
            container_reaper.reap([n.recovery_dir for n in self.nodes], self.started_at)
            container_reaper.remove_node_cgroup_dirs([n.node_id for n in self.nodes if n.node_id])
        if self.hosts is not None:  # after every process on the hosts is gone
            self.network_errors = self.hosts.remove()
        elif self.net is not None:
            self.network_errors = node_network.remove(self.net)
        for n in self.nodes:
            n.alive = False
        self._stopped = True
        if self.base_dir.exists() and self.started_at:
            self.save_state()

    def pids(self) -> list[int]:
        """Pids of the RM and every NM of this cluster (alive or not)."""
        return [p for p in [self.rm_pid, *(n.pid for n in self.nodes)] if p]

    def running(self) -> bool:
        """True while the RM process is alive."""
        return bool(self.rm_pid) and processes.is_alive(self.rm_pid, self.rm_start_ticks)

    # ----- persistence ------------------------------------------------------------------------

    def save_state(self) -> Path:
        """Write base_dir/cluster.json: what `load` needs to stop this cluster from another process."""
        state = {
            "base_dir": str(self.base_dir), "rm_url": self.rm_url, "rm_pid": self.rm_pid,
            "rm_start_ticks": self.rm_start_ticks, "started_at": self.started_at, "stopped": self._stopped,
            "params": {"nodes": self.num_nodes, "node_memory_mb": self.node_memory_mb,
                       "node_vcores": self.node_vcores, "rm_port": self.rm_port,
                       "nm_expiry_s": self.nm_expiry_s, "am_expiry_s": self.am_expiry_s,
                       "heartbeat_interval_ms": self.heartbeat_interval_ms, "cgroups": self.cgroups,
                       "policy": self.policy, "extra_rm_args": self.extra_rm_args,
                       "extra_nm_args": self.extra_nm_args, "env": self.env,
                       "node_bandwidth": self.node_bandwidth_bps, "network": self.network,
                       "node_cpus": self.node_cpus},
            "network_mode": self.network_mode,
            "node_network": self.net.to_json() if self.net else None,
            "nodes": [n.to_json() for n in self.nodes],
        }
        path = self.base_dir / self.STATE_FILE
        durable_storage.write_atomic(path, json.dumps(state, indent=2).encode())
        return path

    @classmethod
    def load(cls, base_dir: Path) -> "LocalCluster":
        """The cluster recorded in base_dir/cluster.json (raises FileNotFoundError if none)."""
        path = Path(base_dir) / cls.STATE_FILE
        state = json.loads(path.read_text())
        c = cls(Path(state["base_dir"]), **state["params"])
        c.rm_url = state["rm_url"]
        c.rm_pid = state["rm_pid"]
        c.rm_start_ticks = state["rm_start_ticks"]
        c.started_at = state["started_at"]
        # `stopped` is informational: stop() on a loaded cluster always re-checks the recorded pids.
        c.nodes = [NodeProcess.from_json(n) for n in state["nodes"]]
        c.network_mode = state.get("network_mode", "")
        if state.get("node_network"):
            c.net = node_network.ClusterNetwork.from_json(state["node_network"])
        if (c.base_dir / "hosts" / testbed_hosts.Testbed.STATE_FILE).exists():
            c.hosts = testbed_hosts.Testbed.load(c.base_dir / "hosts")
        try:
            from protocol import config  # noqa: PLC0415
            c.secret = config.load_cluster(str(c.conf_path)).secret
        except Exception:
            c.secret = ""
        return c

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
