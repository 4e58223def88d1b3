"""Emulated hosts on one machine: the multi-host testbed (docs/testbed.md).

A host here owns what a real host owns, so that what spans nodes is tested and measured as it
runs on separate machines:

    address   a network namespace on a bridge (elastane_cli.node_network: eth0 = 10.213.X.(10+i),
              its own ports, lo), optionally a tc-capped link
    disk      a mount namespace whose /tmp is the host's own dir (<base>/hosts/<name>/tmp); the
              shared paths (the project, the testbed dir, shared storage) stay visible at their
              real paths, as an NFS mount would be on every host
    name      a UTS namespace with its own hostname, and an /etc/hosts naming every testbed host
    CPUs      optionally a cgroup with a CPU quota (cpu.max / cpu.cfs_quota_us) holding everything
              that runs on the host; the host sees that cgroup as its cgroup root (a cgroup
              namespace plus the host's cgroup dirs bind-mounted over /sys/fs/cgroup/...), so its
              NM's per-container cgroups nest inside the budget
    sshd      optionally an sshd on port 22 of the host's address, so bin/start-cluster reaches it
              over ssh as it reaches real hosts (key-only, root; ELASTANE_SSH_OPTS names the key)

Each host is anchored by one long-lived process (`sleep infinity` after the mounts are made) that
holds its namespaces; every other process enters them with `exec_prefix` (nsenter, after joining
the host's cgroup). Killing a host is SIGKILL to every process in its network namespace; cutting
its link takes the bridge side of its veth down, so peers see silence and no RST, as when a host
loses power. `remove` ends whatever is left, removes the cgroups and the network.

Only elastane_cli (LocalCluster's netns mode, the testbed cluster), tests and bench use this.
"""
from __future__ import annotations

import json
import errno
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import msgspec

from nodemanager import cgroup_detect
from protocol import durable_storage

from . import node_network
from protocol.errors import HostError
from protocol.json_types import JsonObject

SSHD = "/usr/sbin/sshd"
CGROUP_PARENT = "elastane-testbed"
# The v1 controllers an NM uses; each is bound per host so its cgroups nest under the host's.
V1_CONTROLLERS = ("cpu", "cpuacct", "memory")
HOST_LEAF = "system"          # the host's own processes (NM, sshd); containers go beside it
SSH_PORT = 22
# How long a busy cgroup dir is tried again when a host is removed, and how often (a process
# SIGKILLed a moment before may still be on its way out: `remove_cgroup_tree`).
CGROUP_BUSY_TIMEOUT_S = 10.0
CGROUP_BUSY_POLL_S = 0.02


class TestbedError(HostError, RuntimeError):
    """The testbed could not be built or used; the message names the step and its error."""

    __test__ = False


def unavailable_reason(sshd: bool = False) -> str | None:
    """Why emulated hosts cannot be built here (None when they can): root, iproute2, util-linux,
    and with `sshd` an OpenSSH server and client."""
    reason = node_network.netns_unavailable_reason()
    if reason:
        return reason
    for tool in ("unshare", "mount", "sleep"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (needs util-linux and coreutils)"
    if sshd:
        if not os.access(SSHD, os.X_OK):
            return f"no OpenSSH server at {SSHD} (apt-get install openssh-server)"
        for tool in ("ssh", "ssh-keygen"):
            if shutil.which(tool) is None:
                return f"`{tool}` not found (apt-get install openssh-client)"
    return None


@dataclass
class CgroupBudget:
    """Where a host's cgroup lives: per hierarchy, the host dir (bound over the mount point inside
    the host) and the mount point it is bound over."""

    version: str                                        # v1 | v2
    dirs: dict[str, str] = field(default_factory=dict)  # mount point -> host dir (root namespace path)

    def procs_files(self) -> list[str]:
        """The cgroup.procs a process writes its pid to, to join the host (its `system` leaf)."""
        return [str(Path(d, HOST_LEAF, "cgroup.procs")) for d in self.dirs.values()]


def _cgroup_mounts() -> tuple[cgroup_detect.CgroupLayout, dict[str, str]]:
    """The layout the NM will use, and for it the mount points to bind per host (point -> ctrl)."""
    text = Path("/proc/mounts").read_text()
    layout = cgroup_detect.detect(text)
    points: dict[str, str] = {}
    if layout.version == cgroup_detect.CgroupVersion.V2 and layout.v2_mount:
        points[layout.v2_mount] = "unified"
    elif layout.version == cgroup_detect.CgroupVersion.V1:
        for ctrl in V1_CONTROLLERS:
            point = layout.v1_mounts.get(ctrl)
            if point:
                points.setdefault(point, ctrl)
    return layout, points


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise TestbedError(f"cannot write {value.strip()!r} to {path}: {e}") from None


def create_budget(tag: str, name: str, cpus: float | None, period_us: int = 100000) -> CgroupBudget | None:
    """The host's cgroup in every hierarchy the NM uses, capped at `cpus` cores (None: no cap).
    None when this machine has no usable cgroups (the host then shares the machine's CPUs)."""
    layout, points = _cgroup_mounts()
    if not points:
        if cpus:
            raise TestbedError(f"a CPU budget needs cgroups, and this machine has none usable ({layout.reason})")
        return None
    budget = CgroupBudget(version=layout.version.value)
    for point in points:
        base = Path(point, CGROUP_PARENT, tag)
        host = base / name
        try:
            (host / HOST_LEAF).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TestbedError(f"cannot create cgroup {host}: {e}") from None
        budget.dirs[point] = str(host)
        if layout.version == cgroup_detect.CgroupVersion.V2:
            # Controllers enabled down to the host's parent; the host's own subtree_control waits
            # until its processes sit in its leaf (`enable_host_controllers`: v2's rule that a
            # cgroup with controllers for its children holds no processes itself).
            for d in (Path(point), Path(point, CGROUP_PARENT), base):
                _enable_v2_controllers(d)
            if cpus:
                _write(host / "cpu.max", f"{int(cpus * period_us)} {period_us}")
        elif cpus and points[point] == "cpu":
            _write(host / "cpu.cfs_period_us", str(period_us))
            _write(host / "cpu.cfs_quota_us", str(int(cpus * period_us)))
    return budget


def _enable_v2_controllers(d: Path) -> None:
    have = set((d / "cgroup.controllers").read_text().split())
    want = " ".join(f"+{c}" for c in ("cpu", "memory") if c in have)
    if want:
        _write(d / "cgroup.subtree_control", want)


def enable_host_controllers(budget: CgroupBudget) -> None:
    """v2: let the host's NM give its containers cpu and memory limits (once the host's own
    processes are in its leaf)."""
    if budget.version == cgroup_detect.CgroupVersion.V2.value:
        for d in budget.dirs.values():
            _enable_v2_controllers(Path(d))


def remove_cgroup_tree(top: Path, busy_timeout_s: float = CGROUP_BUSY_TIMEOUT_S,
                       deadline: float | None = None) -> list[str]:
    """rmdir `top` and every cgroup under it, deepest first; the ones that would not go.

    A dir that is busy (EBUSY: a process still in it) is tried again every CGROUP_BUSY_POLL_S
    until `busy_timeout_s` has passed since the first refusal, as YARN's NM retries a container's
    cgroup (its delete-timeout-ms): a process just SIGKILLed leaves its network namespace -- where
    `Testbed.kill_host` looks for processes -- before it leaves its cgroup, and on a loaded machine
    its exit takes long enough for a first rmdir to fail. `deadline` (time.monotonic()) bounds the
    retries instead, one for several trees (a testbed's whole removal)."""
    if not top.is_dir():
        return []
    left: list[str] = []
    dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for d in [*dirs, top]:
        while True:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno == errno.EBUSY:
                    now = time.monotonic()
                    deadline = now + busy_timeout_s if deadline is None else deadline
                    if now < deadline:
                        time.sleep(CGROUP_BUSY_POLL_S)
                        continue
                left.append(f"{d}: {e.strerror}")
            break
    return left


@dataclass
class Host:
    """One emulated host: its name, address, anchor process and cgroup budget."""

    index: int
    name: str
    ip: str
    namespace: str
    veth: str
    dir: str
    cpus: float | None = None
    anchor_pid: int = 0
    sshd_pid: int = 0
    budget: CgroupBudget | None = None
    cpu_list: str | None = None     # the machine CPUs the host is pinned to (None: any)

    @property
    def tmp_dir(self) -> Path:
        """The host's /tmp, as seen from outside the host."""
        return Path(self.dir) / "tmp"

    def exec_prefix(self) -> list[str]:
        """Prefix that runs a command on this host: join its cgroup, enter its namespaces (the pid
        stays the same: sh and nsenter exec)."""
        join = 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; done; ' \
               'while [ "$1" != -- ]; do shift; done; shift; exec "$@"'
        procs = self.budget.procs_files() if self.budget else []
        return ["sh", "-c", join, "enter-host", *procs, "--", *self.pin_prefix(),
                "nsenter", "-t", str(self.anchor_pid), "--net", "--mount", "--uts", "--cgroup", "--"]

    def pin_prefix(self) -> list[str]:
        """taskset to the host's CPUs: what runs on the host, and everything it starts, stays there."""
        return ["taskset", "-c", self.cpu_list] if self.cpu_list else []

    def to_json(self) -> JsonObject:
        out: JsonObject = msgspec.to_builtins(self)
        return out

    @classmethod
    def from_json(cls, d: object) -> "Host":
        """`to_json`'s object read back, its budget too (msgspec.ValidationError naming a bad field)."""
        return msgspec.convert(d, cls)


def pin_assignment(cpus: Sequence[float | None], machine_cpus: Sequence[int] | None = None) -> list[str | None]:
    """The machine CPUs each capped host is pinned to: as many as its budget needs (one for a
    budget up to a core), handed out in turn over the CPUs this process may use; an uncapped host
    (the master) floats. Why: a real host owns its cores. An emulated one that floats over the
    machine's CPUs has the kernel hand its executors' small quotas out per CPU, in slices of up to
    5 ms (sched_cfs_bandwidth_slice_us) against a 6.25 ms quota, and an executor that moves CPU may
    wait for quota stranded on the one it left. Pinned, the same shape's epoch times vary far less
    between repeats (docs/testbed.md, "Pinned hosts"). TestbedError when the budgets pinned to one
    CPU (each host's spread evenly over its CPUs) add up to more than that CPU."""
    avail = sorted(machine_cpus if machine_cpus is not None else os.sched_getaffinity(0))
    out: list[str | None] = []
    load: dict[int, float] = {}
    k = 0
    for c in cpus:
        if not c:
            out.append(None)
            continue
        need = min(len(avail), max(1, math.ceil(c - 1e-9)))
        mine = [avail[(k + i) % len(avail)] for i in range(need)]
        k += need
        for cpu in mine:
            load[cpu] = load.get(cpu, 0.0) + c / need
        out.append(",".join(map(str, sorted(mine))))
    over = {cpu: round(v, 4) for cpu, v in load.items() if v > 1.0 + 1e-9}
    if over:
        raise TestbedError(f"pinned hosts' CPU budgets exceed their CPUs (cores asked of each: {over}); "
                           f"this machine has {len(avail)} CPUs for {sum(1 for c in cpus if c)} capped hosts")
    return out


class Testbed:
    """N emulated hosts under `base_dir` (see the module docstring).

    `cpus` caps each host (a list gives one value per host; None leaves a host uncapped),
    `pin_cpus` pins every capped host to one of the machine's CPUs (round robin; `pin_assignment`),
    `bandwidth_bps` caps each host's link, `shared` are the paths every host sees (the project and
    `base_dir` always are), `sshd` starts an sshd on every host.
    """

    STATE_FILE = "testbed.json"
    __test__ = False    # not a pytest test class

    def __init__(self, base_dir: Path, hosts: int, names: Sequence[str] | None = None,
                 cpus: float | Sequence[float | None] | None = None, bandwidth_bps: int | None = None,
                 shared: Sequence[Path] = (), sshd: bool = False, pin_cpus: bool = False) -> None:
        if hosts < 1:
            raise ValueError(f"a testbed has at least 1 host, got {hosts}")
        self.base_dir = Path(base_dir).resolve()
        self.count = hosts
        self.names = list(names) if names is not None else [f"host{i}" for i in range(hosts)]
        if len(self.names) != hosts or len(set(self.names)) != hosts:
            raise ValueError(f"need {hosts} distinct host names, got {self.names}")
        per_host: list[float | None] = list(cpus) if isinstance(cpus, Sequence) else [cpus] * hosts
        if len(per_host) != hosts:
            raise ValueError(f"cpus lists {len(per_host)} values for {hosts} hosts")
        for c in per_host:
            if c is not None and c <= 0:
                raise ValueError(f"a host's CPU budget must be > 0 cores, got {c}")
        self.cpus: list[float | None] = per_host
        self.pin: list[str | None] = pin_assignment(per_host) if pin_cpus else [None] * hosts
        self.bandwidth_bps = bandwidth_bps
        project = Path(__file__).resolve().parent.parent
        self.shared = [self.base_dir, project, *(Path(p).resolve() for p in shared)]
        self.with_sshd = sshd
        self.net: node_network.ClusterNetwork | None = None
        self.hosts: list[Host] = []
        self.errors: list[str] = []             # what `remove` could not remove
        self.leftover_pids: list[int] = []      # processes `remove` had to kill

    # ----- paths and ssh ------------------------------------------------------------------------

    @property
    def ssh_dir(self) -> Path:
        return self.base_dir / "ssh"

    @property
    def ssh_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    def ssh_opts(self) -> str:
        """ELASTANE_SSH_OPTS for reaching the hosts: the testbed's key, host keys not recorded
        (every testbed has new ones)."""
        return (f"-i {shlex.quote(str(self.ssh_key))} -o IdentitiesOnly=yes -o StrictHostKeyChecking=no "
                "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=10")

    def host(self, name_or_index: str | int) -> Host:
        if isinstance(name_or_index, int):
            return self.hosts[name_or_index]
        for h in self.hosts:
            if h.name == name_or_index:
                return h
        raise KeyError(f"no testbed host {name_or_index!r}")

    # ----- build --------------------------------------------------------------------------------

    def create(self) -> "Testbed":
        """Build every host (network, cgroups, namespaces, sshd); on failure remove what was made."""
        reason = unavailable_reason(self.with_sshd)
        if reason:
            raise TestbedError(f"cannot build emulated hosts here: {reason}")
        for p in self.shared:
            p.mkdir(parents=True, exist_ok=True)
        try:
            self.net = node_network.create(self.base_dir, self.count, self.bandwidth_bps)
            self.hosts = [Host(index=i, name=self.names[i], ip=self.net.node_ip(i),
                               namespace=self.net.namespace(i), veth=self.net.host_veth(i),
                               dir=str(self.base_dir / "hosts" / self.names[i]), cpus=self.cpus[i],
                               cpu_list=self.pin[i])
                          for i in range(self.count)]
            self.save_state()
            (self.base_dir / "etc").mkdir(exist_ok=True)
            (self.base_dir / "etc" / "hosts").write_text(
                "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                + "".join(f"{h.ip}\t{h.name}\n" for h in self.hosts))
            if self.with_sshd:
                self._make_keys()
            for h in self.hosts:
                self._start_host(h)
                self.save_state()
            if self.with_sshd:
                for h in self.hosts:
                    self._start_sshd(h)
                self.save_state()
                for h in self.hosts:
                    self._await_sshd(h)
        except BaseException:
            self.remove()
            raise
        return self

    def _make_keys(self) -> None:
        self.ssh_dir.mkdir(mode=0o700, exist_ok=True)
        for key in (self.ssh_key, self.ssh_dir / "host_ed25519_key"):
            if not key.exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "elastane-testbed", "-f", str(key)])
        (self.ssh_dir / "authorized_keys").write_text(Path(str(self.ssh_key) + ".pub").read_text())
        os.chmod(self.ssh_dir / "authorized_keys", 0o600)

    def _start_host(self, h: Host) -> None:
        tmp = h.tmp_dir
        tmp.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o1777)
        h.budget = create_budget(node_network.cluster_tag(self.base_dir), h.name, h.cpus)
        script = ["set -e", f"hostname {shlex.quote(h.name)}",
                  f"mount --bind {shlex.quote(str(self.base_dir / 'etc' / 'hosts'))} /etc/hosts"]
        if h.budget:
            for point, d in h.budget.dirs.items():
                script.append(f"mount --bind {shlex.quote(d)} {shlex.quote(point)}")
        # Shared paths under /tmp stay visible at their real paths once /tmp is the host's own.
        for p in self.shared:
            if p.is_relative_to("/tmp") and p != Path("/tmp"):
                inner = tmp / p.relative_to("/tmp")
                script += [f"mkdir -p {shlex.quote(str(inner))}",
                           f"mount --rbind {shlex.quote(str(p))} {shlex.quote(str(inner))}"]
        script += [f"mount --rbind {shlex.quote(str(tmp))} /tmp",
                   # The anchor moves to the host's leaf only now: the cgroup namespace's root
                   # is the host's cgroup, where unshare ran.
                   *(f"echo $$ > {shlex.quote(str(Path(p, HOST_LEAF, 'cgroup.procs')))}"
                     for p in (h.budget.dirs if h.budget else {})),
                   "echo ready", "exec sleep infinity"]
        host_procs = [str(Path(d, "cgroup.procs")) for d in (h.budget.dirs.values() if h.budget else [])]
        join = "".join(f"echo $$ > {shlex.quote(p)}; " for p in host_procs)
        cmd = ["sh", "-c", join + 'exec "$@"', "host-anchor", *h.pin_prefix(),
               "nsenter", f"--net={node_network.NETNS_DIR / h.namespace}", "--",
               "unshare", "--mount", "--uts", "--cgroup", "--propagation", "private", "--",
               "sh", "-c", "\n".join(script)]
        with open(Path(h.dir) / "anchor.log", "wb") as anchor_log:
            anchor = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=anchor_log,
                                 start_new_session=True)
        h.anchor_pid = anchor.pid
        assert anchor.stdout is not None
        line = anchor.stdout.readline()  # "ready" once the mounts are made; EOF if the script failed
        anchor.stdout.close()
        if line.strip() != b"ready":
            anchor.wait(timeout=10)
            raise TestbedError(f"host {h.name} did not start (exit {anchor.returncode}): "
                               + (Path(h.dir) / "anchor.log").read_text(errors="replace").strip())
        if h.budget:
            enable_host_controllers(h.budget)

    def _start_sshd(self, h: Host) -> None:
        conf = Path(h.dir) / "sshd_config"
        conf.write_text("\n".join([
            f"ListenAddress {h.ip}:{SSH_PORT}",
            f"HostKey {self.ssh_dir / 'host_ed25519_key'}",
            f"AuthorizedKeysFile {self.ssh_dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PrintMotd no",
            "PidFile none", "MaxStartups 100:30:200", "MaxSessions 100", "UseDNS no", ""]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        with open(Path(h.dir) / "sshd.log", "ab") as sshd_log:
            p = subprocess.Popen([*h.exec_prefix(), SSHD, "-D", "-e", "-f", str(conf)],
                                 stdin=subprocess.DEVNULL, stdout=sshd_log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        h.sshd_pid = p.pid

    def _await_sshd(self, h: Host, timeout_s: float = 20.0) -> None:
        """Until the host's sshd accepts connections (it listens once its keys are loaded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection((h.ip, SSH_PORT), timeout=1.0):
                    return
            except OSError as e:
                if not _alive(h.sshd_pid) or time.monotonic() > deadline:
                    log = (Path(h.dir) / "sshd.log").read_text(errors="replace")[-2000:]
                    raise TestbedError(f"sshd on {h.name} ({h.ip}) is not accepting connections ({e}): {log}") from None
                time.sleep(0.05)

    # ----- use ----------------------------------------------------------------------------------

    def run(self, host: str | int, cmd: Sequence[str], env: dict[str, str] | None = None,
            timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run `cmd` on a host and wait for it (stdout and stderr captured)."""
        h = self.host(host)
        r = subprocess.run([*h.exec_prefix(), *cmd], capture_output=True, text=True, timeout=timeout,
                           env=env, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise TestbedError(f"{' '.join(cmd)} on {h.name} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def pids(self, host: str | int) -> list[int]:
        """Every process on the host (in its network namespace), its anchor and sshd included."""
        return node_network.namespace_pids(self.host(host).namespace)

    def service_pids(self, host: str | int) -> list[int]:
        """The host's processes other than its anchor, its sshd and sshd's sessions."""
        h = self.host(host)
        keep = {h.anchor_pid, h.sshd_pid}
        out = []
        for pid in self.pids(host):
            if pid in keep:
                continue
            # A zombie has ended (only its exit status waits for a reaper, which on a machine whose
            # init is slow to reap can take a while): nothing of it runs any more.
            if _is_sshd(pid) or _state(pid) in ("Z", "X", "") or _exiting(pid):
                continue
            out.append(pid)
        return out

    def cgroup_dirs(self, host: str | int) -> list[str]:
        """Cgroup dirs under the host's cgroups other than the host's own leaf (root-namespace paths)."""
        h = self.host(host)
        out: list[str] = []
        for d in (h.budget.dirs.values() if h.budget else []):
            # os.walk, not Path.rglob: a dir removed while it is walked (a finished container's
            # cgroup, which its NM cleans up meanwhile) is skipped instead of failing the walk.
            for root, dirs, _ in os.walk(d):
                out += [os.path.join(root, x) for x in dirs if x != HOST_LEAF]
        return sorted(out)

    def cpu_seconds(self, host: str | int) -> float | None:
        """CPU time everything on the host has used so far, in seconds, from its cgroup's own
        accounting (v2 cpu.stat usage_usec, v1 cpuacct.usage); None for a host without a cgroup."""
        h = self.host(host)
        for d in (h.budget.dirs.values() if h.budget else []):
            stat, acct = Path(d, "cpu.stat"), Path(d, "cpuacct.usage")
            if acct.is_file():
                return int(acct.read_text()) / 1e9
            if stat.is_file():
                for line in stat.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
        return None

    def link_bytes(self, host: str | int) -> tuple[int, int]:
        """Bytes the host has (sent, received) over its link so far: its veth's counters at the
        bridge (what the bridge side receives the host sent)."""
        stats = Path("/sys/class/net", self.host(host).veth, "statistics")
        return int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())

    def kill_host(self, host: str | int, cut_link: bool = True) -> list[int]:
        """The host dies: its link is cut (no RST reaches its peers) and every process on it is
        SIGKILLed. Returns the pids killed."""
        h = self.host(host)
        if cut_link:
            self.cut_link(host)
        killed: list[int] = []
        for _ in range(50):  # a fork racing the kill may add one; go round until the host is empty
            pids = self.pids(host)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        h.anchor_pid = h.sshd_pid = 0
        self.save_state()
        return killed

    def cut_link(self, host: str | int) -> None:
        """Take the host's link down at the bridge: its packets go nowhere, nothing answers them."""
        node_network.run(["ip", "link", "set", self.host(host).veth, "down"])

    def restore_link(self, host: str | int) -> None:
        node_network.run(["ip", "link", "set", self.host(host).veth, "up"])

    def revive_host(self, host: str | int) -> None:
        """A killed host comes back as a rebooted one does: its dir (its disk) as it was, nothing of
        it running; its link up, its namespaces, cgroups (made afresh) and sshd started again."""
        h = self.host(host)
        if h.anchor_pid:
            raise TestbedError(f"host {h.name} is running (anchor pid {h.anchor_pid}); kill it first")
        # Every process of the host is gone: its cgroups go too, and come back as a fresh boot's.
        for d in (h.budget.dirs.values() if h.budget else []):
            left = remove_cgroup_tree(Path(d))
            if left:
                raise TestbedError(f"host {h.name}'s cgroups would not go: {left}")
        self.restore_link(host)
        self._start_host(h)
        self.save_state()
        if self.with_sshd:
            self._start_sshd(h)
            self.save_state()
            self._await_sshd(h)

    # ----- teardown -----------------------------------------------------------------------------

    def remove(self) -> list[str]:
        """SIGKILL whatever still runs on the hosts, remove their cgroups and the network.
        Returns the errors (never raises); `leftover_pids` are the processes it had to kill."""
        errors: list[str] = []
        busy_until = time.monotonic() + CGROUP_BUSY_TIMEOUT_S     # one bound for every host's dirs
        for h in self.hosts:
            keep = {h.anchor_pid, h.sshd_pid}
            pids = node_network.namespace_pids(h.namespace)
            # As service_pids counts them: a process already in its exit (a zombie, or past exit_mm
            # on a loaded machine, its cmdline empty) has ended and is no leftover.
            self.leftover_pids += [p for p in pids if p not in keep and not _is_sshd(p)
                                   and _state(p) not in ("Z", "X", "") and not _exiting(p)]
            self.kill_host(h.index, cut_link=False)
        for h in self.hosts:
            if h.budget:
                for d in h.budget.dirs.values():
                    errors += remove_cgroup_tree(Path(d), deadline=busy_until)
        tag = node_network.cluster_tag(self.base_dir)
        _, points = _cgroup_mounts()
        for point in points:
            for top in (Path(point, CGROUP_PARENT, tag), Path(point, CGROUP_PARENT)):
                try:
                    top.rmdir()
                except OSError:
                    pass  # another testbed's hosts still there, or already gone
        if self.net is not None:
            errors += node_network.remove(self.net)
        else:
            errors += node_network.remove_tag(tag)
        self.errors = errors
        if self.base_dir.exists():
            self.save_state()
        return errors

    # ----- persistence --------------------------------------------------------------------------

    def save_state(self) -> Path:
        state = {"base_dir": str(self.base_dir), "names": self.names, "cpus": self.cpus,
                 "bandwidth_bps": self.bandwidth_bps, "shared": [str(p) for p in self.shared],
                 "sshd": self.with_sshd, "net": self.net.to_json() if self.net else None,
                 "hosts": [h.to_json() for h in self.hosts]}
        path = self.base_dir / self.STATE_FILE
        durable_storage.write_atomic(path, json.dumps(state, indent=2).encode())
        return path

    @classmethod
    def load(cls, base_dir: Path) -> "Testbed":
        state = json.loads((Path(base_dir) / cls.STATE_FILE).read_text())
        tb = cls(Path(state["base_dir"]), len(state["names"]), names=state["names"], cpus=state["cpus"],
                 bandwidth_bps=state["bandwidth_bps"], sshd=state["sshd"])
        tb.shared = [Path(p) for p in state["shared"]]
        tb.net = node_network.ClusterNetwork.from_json(state["net"]) if state["net"] else None
        tb.hosts = [Host.from_json(h) for h in state["hosts"]]
        return tb

    def __enter__(self) -> "Testbed":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    if p.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return Path(f"/proc/{pid}/stat").exists() and _state(pid) != "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _exiting(pid: int) -> bool:
    """A process in exit whose memory is already released (its cmdline reads empty; the kernel
    shows that only for kernel threads, which no host's pid list holds, and processes past
    exit_mm): it has ended but not yet reached Z, as seen on a loaded machine after stop-cluster."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() == b""
    except OSError:
        return True


def _is_sshd(pid: int) -> bool:
    """An sshd of the host (its listener or a session's): by executable, or by the title sshd
    gives its processes (`sshd: root@notty`) where it runs through a loader."""
    try:
        if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "sshd":
            return True
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return argv0.startswith(b"sshd:") or argv0.endswith(b"/sshd")
