"""Two real ResourceManager processes (`python -m rm --rm-id ...`) on a real etcd: one is elected
active, the other serves as standby (haState, redirects to the active, 503 to NMs and AMs); when
the active is killed the standby takes over with every acknowledged application; a killed RM comes
back as standby; an active that is paused loses its term and steps down when it resumes; an
operator's transition-to-standby hands the role over; bad HA settings stop the RM at start naming
the setting."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

import etcd_server as etcdmod
from polling import wait_until
from s3_server import free_ports
from scripted_am import GATE_ENV, throttle_until_gate, use_scripted_am

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(etcdmod.unavailable_reason() is not None,
                                 reason=f"no etcd here: {etcdmod.unavailable_reason()}")]

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 2


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_plain = urllib.request.build_opener(_NoRedirect)


def call(url: str, method: str = "GET", body: Optional[dict[str, Any]] = None,
         user: str = "alice") -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, headers) of one call, redirects not followed; (0, {}, {}) when nothing answers."""
    sep = "&" if "?" in url else "?"
    req = urllib.request.Request(f"{url}{sep}user.name={user}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with _plain.open(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"text": raw.decode(errors="replace")}
        return e.code, payload, dict(e.headers)
    except (urllib.error.URLError, OSError):
        return 0, {}, {}


class RmProcess:
    def __init__(self, rm_id: str, port: int, conf: Path, work: Path):
        self.rm_id, self.port, self.conf, self.work = rm_id, port, conf, work
        self.url = f"http://127.0.0.1:{port}"
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> None:
        ready = self.work / f"{self.rm_id}.ready"
        ready.unlink(missing_ok=True)
        log = open(self.work / f"{self.rm_id}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rm", "--rm-id", self.rm_id, "--config", str(self.conf / "rm.toml"),
             "--cluster-config", str(self.conf / "cluster.toml"), "--host", "127.0.0.1", "--port", str(self.port),
             "--state-dir", str(self.work / f"state-{self.rm_id}"), "--ready-file", str(ready)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

        def ready_or_dead() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log_tail()
            return ready.exists()
        wait_until(ready_or_dead, 60, f"{self.rm_id}'s ready file", 0.05)

    def ha_state(self) -> str:
        status, body, _ = call(self.url + "/ws/v1/cluster/info")
        return str(body.get("clusterInfo", {}).get("haState", "")) if status == 200 else ""

    def ha(self) -> dict[str, Any]:
        return call(self.url + "/ws/v1/cluster/ha")[1].get("ha", {})

    def log_tail(self, n: int = 40) -> str:
        p = self.work / f"{self.rm_id}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise


NM_HEARTBEAT_MS = 200      # the NMs' heartbeat period, in rm.toml and in NmProcess's flags


def write_conf(conf: Path, etcd_endpoint: str, ports: list[int], extra: str = "", rm_extra: str = "") -> None:
    conf.mkdir(parents=True, exist_ok=True)
    rm_toml = rm_extra or "[rm]\nnm_expiry_s = 600.0\nam_expiry_s = 600.0\n"
    if "nm_heartbeat_interval_ms" not in rm_toml:       # (rm_extra has the [rm] table alone)
        # The NMs heartbeat at the RM's period (NmProcess starts them at the same one).
        rm_toml += f"nm_heartbeat_interval_ms = {NM_HEARTBEAT_MS}\n"
    (conf / "rm.toml").write_text(rm_toml)
    addresses = ", ".join(f'rm{i + 1} = "http://127.0.0.1:{p}"' for i, p in enumerate(ports))
    (conf / "cluster.toml").write_text(
        f'[cluster]\nsecret = "{os.urandom(16).hex()}"\nrm_address = "http://127.0.0.1:{ports[0]}"\n\n'
        f'[ha]\nenabled = true\nrm_ids = [{", ".join(f"{chr(34)}rm{i + 1}{chr(34)}" for i in range(len(ports)))}]\n'
        f'rm_addresses = {{ {addresses} }}\netcd_endpoints = ["{etcd_endpoint}"]\nlease_s = {LEASE_S}\n{extra}')


@contextmanager
def started_pair(etcd_endpoint: str, tmp_path: Path, rm_extra: str = "") -> Iterator[tuple[RmProcess, RmProcess]]:
    """rm1 and rm2 on `etcd_endpoint`, started (rm.toml's settings: `rm_extra`, else long expiries)."""
    ports = free_ports(2)
    write_conf(tmp_path / "conf", etcd_endpoint, ports, rm_extra=rm_extra)
    rms = (RmProcess("rm1", ports[0], tmp_path / "conf", tmp_path), RmProcess("rm2", ports[1], tmp_path / "conf", tmp_path))
    try:
        for rm in rms:
            rm.start()
        yield rms
    finally:
        errors = []
        for rm in rms:              # every one stopped, whatever the first one's stop raised
            try:
                rm.stop()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture
def pair(etcd: Any, tmp_path: Path) -> Iterator[tuple[RmProcess, RmProcess]]:
    with started_pair(etcd.endpoint, tmp_path) as rms:
        yield rms


def one_active(rms: tuple[RmProcess, RmProcess]) -> tuple[RmProcess, RmProcess]:
    def states() -> Optional[tuple[RmProcess, RmProcess]]:
        s = [rm.ha_state() for rm in rms]
        if sorted(s) == ["ACTIVE", "STANDBY"]:
            return (rms[0], rms[1]) if s[0] == "ACTIVE" else (rms[1], rms[0])
        return None
    return wait_until(states, 60, "one RM active and the other standby", 0.1)


def submit(rm_url: str) -> str:
    status, body, _ = call(rm_url + "/ws/v1/cluster/apps/new-application", "POST")
    assert status == 200, body
    app_id = body["application-id"]
    sub = {"application-id": app_id, "application-name": "ha-test", "application-type": "YARN",
           "am-container-spec": {"commands": {"command": "sleep 600"}}, "resource": {"memory": 128, "vCores": 1}}
    status, body, _ = call(rm_url + "/ws/v1/cluster/apps", "POST", sub)
    assert status == 202, body
    return str(app_id)


def test_the_standby_takes_over_with_every_acknowledged_app_and_the_old_active_returns_as_standby(pair):
    active, standby = one_active(pair)
    app_id = submit(active.url)

    # The standby: haState STANDBY with who is active, client calls redirected there, NMs refused.
    info = call(standby.url + "/ws/v1/cluster/info")[1]["clusterInfo"]
    assert info["haState"] == "STANDBY" and info["haActiveRmId"] == active.rm_id
    status, _, headers = call(standby.url + f"/ws/v1/cluster/apps/{app_id}")
    assert status == 307 and headers["Location"].startswith(active.url + f"/ws/v1/cluster/apps/{app_id}")
    status, body, _ = call(standby.url + "/internal/v1/node/heartbeat", "POST", {})
    assert status == 503 and "standby" in body["RemoteException"]["message"]
    assert body["RemoteException"]["javaClassName"] == "org.apache.hadoop.ipc.StandbyException"
    first_epoch = active.ha()["epoch"]

    active.signal(signal.SIGKILL)           # the active's host dies
    assert active.proc is not None and active.proc.wait(10) == -signal.SIGKILL
    wait_until(lambda: standby.ha_state() == "ACTIVE", 60, f"{standby.rm_id} active after the kill", 0.1)
    info = call(standby.url + "/ws/v1/cluster/info")[1]["clusterInfo"]
    assert info["haState"] == "ACTIVE" and info["haRmId"] == standby.rm_id and info["haEpoch"] > first_epoch
    assert info["rmStateStoreName"].endswith("EtcdStateStore") and info["haZooKeeperConnectionState"] == "etcd: CONNECTED"
    status, body, _ = call(standby.url + f"/ws/v1/cluster/apps/{app_id}")
    assert status == 200 and body["app"]["id"] == app_id and body["app"]["state"] == "ACCEPTED"
    # The web UI says which RM is the active one (the standby's pages redirect to it).
    with urllib.request.urlopen(standby.url + "/cluster", timeout=10) as r:
        assert f"<b>{standby.rm_id}</b>, the active ResourceManager" in r.read().decode()
    # The CLI given both RMs fails over past the dead one.
    out = elastane(active.conf, active.work, "--rm", f"{active.url},{standby.url}", "app", "status", app_id)
    assert out.returncode == 0 and app_id in out.stdout and "ACCEPTED" in out.stdout, out.stderr

    active.start()                           # the old host returns: standby, following the new active
    wait_until(lambda: active.ha().get("activeRmId") == standby.rm_id, 60, "the old active sees the new one", 0.1)
    assert active.ha_state() == "STANDBY" and standby.ha_state() == "ACTIVE"
    for rm in pair:
        assert rm.stop() == 0, rm.log_tail()


def test_a_paused_active_loses_its_term_and_steps_down_when_it_resumes(pair):
    active, standby = one_active(pair)
    active.signal(signal.SIGSTOP)            # alive but silent: its lease runs out on etcd
    wait_until(lambda: standby.ha_state() == "ACTIVE", 60, f"{standby.rm_id} active while the other is paused", 0.1)
    active.signal(signal.SIGCONT)
    # Its first answer after resuming is already not an active's: its lease ran out while it was
    # stopped, so it refuses (503), is between its two servers (nothing answers), or answers as a
    # standby -- whichever of its tasks runs first.
    status, body, _ = call(active.url + "/ws/v1/cluster/info")
    assert status != 200 or body["clusterInfo"]["haState"] == "STANDBY", (status, body)
    assert status != 503 or "standby" in body["RemoteException"]["message"] \
        or "no longer active" in body["RemoteException"]["message"], body
    wait_until(lambda: active.ha_state() == "STANDBY", 60, f"{active.rm_id} standby after it resumed", 0.1)
    ha = active.ha()
    assert ha["history"][-1]["event"] in ("LEASE_EXPIRED", "FENCED"), ha
    assert ha["history"][-1]["from"] in ("ACTIVE", "BECOMING_ACTIVE")
    assert standby.ha_state() == "ACTIVE" and ha["activeRmId"] in ("", standby.rm_id)


def elastane(conf: Path, work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator runs it, reading the pair from cluster.toml's [ha]."""
    env = dict(os.environ, ELASTANE_CONF_DIR=str(conf), ELASTANE_CLUSTER_DIR=str(work / "no-local-cluster"))
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_transition_to_standby_hands_the_role_over_and_only_admins_may(pair):
    active, standby = one_active(pair)
    status, body, _ = call(active.url + "/ws/v1/cluster/ha/transition-to-standby", "POST", user="mallory")
    assert status == 403 and "admins" in body["RemoteException"]["message"]
    assert active.ha_state() == "ACTIVE"

    out = elastane(active.conf, active.work, "--user", "root", "rm", "ha-state")
    assert out.returncode == 0, out.stderr
    rows = {ln.split()[0]: ln.split()[2] for ln in out.stdout.splitlines()[1:] if ln.strip()}
    assert rows == {active.rm_id: "ACTIVE", standby.rm_id: "STANDBY"}, out.stdout

    out = elastane(active.conf, active.work, "--user", "root", "rm", "transition-to-standby", "rm9")
    assert out.returncode == 2 and "rm_id: 'rm9'" in out.stderr
    out = elastane(active.conf, active.work, "--user", "root", "rm", "transition-to-standby")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{active.rm_id}: STANDBY") and "transition-to-standby by root" in out.stdout
    wait_until(lambda: standby.ha_state() == "ACTIVE", 60, f"{standby.rm_id} takes over", 0.1)
    # (between its active server and its standby app nothing answers for a moment)
    wait_until(lambda: active.ha_state() == "STANDBY", 60, f"{active.rm_id} serves as standby", 0.1)


def test_bad_ha_settings_stop_the_rm_naming_the_setting(etcd, tmp_path):
    ports = free_ports(3)
    cases = [
        (["--rm-id", "rm7"], "", "rm_id: 'rm7'"),
        (["--rm-id", "rm1", "--port", str(ports[2])], "", "rm_addresses.rm1"),
        (["--rm-id", "rm1"], 'rm_ids = ["rm1", "rm1"]\n', "rm_ids: 'rm1' is listed twice"),
        (["--rm-id", "rm1"], f'etcd_endpoints = ["http://127.0.0.1:{ports[2]}"]\n', "etcd_endpoints"),
    ]
    for i, (args, override, needle) in enumerate(cases):
        conf = tmp_path / f"conf{i}"
        write_conf(conf, etcd.endpoint, ports[:2])
        text = (conf / "cluster.toml").read_text()
        if override:
            key = override.split(" =", 1)[0]
            text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(key + " ")) + "\n" + override
            (conf / "cluster.toml").write_text(text)
        argv = [sys.executable, "-m", "rm", "--config", str(conf / "rm.toml"), "--cluster-config",
                str(conf / "cluster.toml"), "--host", "127.0.0.1", "--state-dir", str(tmp_path / f"s{i}"), *args]
        if "--port" not in args:
            argv += ["--port", str(ports[0])]
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and needle in proc.stderr, (args, override, proc.stderr)


def running_nodes(rm: RmProcess) -> list[str]:
    status, body, _ = call(rm.url + "/ws/v1/cluster/nodes")
    nodes = ((body.get("nodes") or {}).get("node") or []) if status == 200 else []
    return [n["id"] for n in nodes if n.get("state") == "RUNNING"]


def am_containers(rm: RmProcess, app_id: str) -> list[str]:
    """The AM container ids of the app's attempts, in attempt order (those allocated so far)."""
    status, body, _ = call(rm.url + f"/ws/v1/cluster/apps/{app_id}/appattempts")
    attempts = ((body.get("appAttempts") or {}).get("appAttempt") or []) if status == 200 else []
    return [a["containerId"] for a in sorted(attempts, key=lambda a: a["id"]) if a.get("containerId")]


class NmProcess:
    """A real NodeManager of the pair's cluster (cgroups off, cold container starts)."""

    def __init__(self, conf: Path, work: Path, name: str, rm_url: str, memory_mb: int = 1024, vcores: int = 2):
        (conf / "nm.toml").write_text("[nm]\nwarm_modules = []\ncontainer_shells = 0\narbiter = false\n")
        self.work, self.name = work, name
        ready = work / f"{name}.ready"
        log = open(work / f"{name}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nodemanager", "--config", str(conf / "nm.toml"), "--cluster-config",
             str(conf / "cluster.toml"), "--rm-address", rm_url, "--host", "127.0.0.1", "--port", "0",
             "--memory-mb", str(memory_mb), "--vcores", str(vcores), "--local-dir", str(work / f"{name}-local"),
             "--log-dir", str(work / f"{name}-logs"), "--recovery-dir", str(work / f"{name}-recovery"),
             "--cgroups", "off", "--heartbeat-interval-ms", str(NM_HEARTBEAT_MS), "--ready-file", str(ready)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        try:
            wait_until(lambda: self.proc.poll() is None and ready.exists(), 60, f"{name} registered", 0.1)
        except BaseException:
            self.stop()             # not left running by a constructor that raises
            raise
        info = json.loads(ready.read_text())
        self.node_id, self.http_address = str(info["node_id"]), str(info["http_address"])

    def containers(self) -> dict[str, str]:
        """Container id -> state of every container the NM holds."""
        status, body, _ = call(f"http://{self.http_address}/ws/v1/node/containers")
        rows = ((body.get("containers") or {}).get("container") or []) if status == 200 else []
        return {str(c["id"]): str(c["state"]) for c in rows}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def log_tail(self) -> str:
        return (self.work / f"{self.name}.log").read_text(errors="replace")[-3000:]


def node_used_mb(rm: RmProcess, node_id: str) -> int:
    status, body, _ = call(rm.url + "/ws/v1/cluster/nodes")
    nodes = ((body.get("nodes") or {}).get("node") or []) if status == 200 else []
    return next((int(n["usedMemoryMB"]) for n in nodes if n["id"] == node_id), -1)


def test_a_nodemanager_fails_over_to_the_new_active(pair, tmp_path):
    active, standby = one_active(pair)
    # Room for two AMs under the queue's AM limit (a tenth of the node): the kept one and a new one.
    nm = NmProcess(active.conf, tmp_path, "nm", active.url, memory_mb=4096, vcores=16)
    try:
        node_id = nm.node_id
        wait_until(lambda: running_nodes(active) == [node_id], 30, "the node RUNNING at the active", 0.1)
        app_id = submit(active.url)
        first = wait_until(lambda: am_containers(active, app_id), 30, "the AM container allocated")
        epoch = active.ha()["epoch"]
        assert first[0].startswith(f"container_e{epoch:02d}_"), first      # YARN's form, the term's epoch
        # The RM launches the AM container: killed before that, no node holds it and the new active
        # rightly starts a second attempt (CI met that race). Kill once the NM runs it.
        wait_until(lambda: first[0] in nm.containers(), 30, "the AM container on the node", 0.1)
        active.signal(signal.SIGKILL)
        assert active.proc is not None and active.proc.wait(10) == -signal.SIGKILL
        wait_until(lambda: standby.ha_state() == "ACTIVE", 60, f"{standby.rm_id} active", 0.1)
        # Its heartbeats move on to the new active, which answers RESYNC; the node registers there
        # with its running containers.
        wait_until(lambda: running_nodes(standby) == [node_id], 60, "the node RUNNING at the new active", 0.1)
        # Work-preserving: the app keeps its attempt, whose AM container (still running) the node's
        # registration re-adopts, charged to the node again.
        assert am_containers(standby, app_id) == first
        wait_until(lambda: node_used_mb(standby, node_id) == 128, 30, "the AM container re-adopted", 0.1)
        # A container of the new term carries its epoch: no id the old active issued comes again.
        other = submit(standby.url)
        second = wait_until(lambda: am_containers(standby, other), 30, "a new app's AM container")
        assert second[0].startswith(f"container_e{standby.ha()['epoch']:02d}_") and second[0] != first[0]
        assert standby.ha()["epoch"] > epoch
    finally:
        rc = nm.stop()
    assert rc == 0, nm.log_tail()


def app_report(rm: RmProcess, app_id: str) -> dict[str, Any]:
    status, body, _ = call(rm.url + f"/ws/v1/cluster/apps/{app_id}")
    return dict(body.get("app") or {}) if status == 200 else {}


def metric(rm: RmProcess, name: str) -> float:
    """One unlabelled sample of the RM's /metrics/prometheus (-1 when it does not answer)."""
    try:
        with urllib.request.urlopen(rm.url + "/metrics/prometheus", timeout=10) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return -1
    return next((float(ln.split()[1]) for ln in text.splitlines() if ln.startswith(name + " ")), -1)


@pytest.fixture
def ps_pair(etcd: Any, tmp_path: Path) -> Iterator[tuple[RmProcess, RmProcess]]:
    """The pair with what a PS job needs beside it: one durable dir for every AM (so either RM's
    launches agree) and expiries that bound the wait for an AM after a failover."""
    rm_toml = f'[rm]\nnm_expiry_s = 60.0\nam_expiry_s = 60.0\ncheckpoint_dir = "{tmp_path / "apps"}"\n'
    with started_pair(etcd.endpoint, tmp_path, rm_toml) as rms:
        yield rms


# The PS AM with a throttle: until the test creates the gate file, each BSP clock (one epoch of
# this job) takes half a second longer, so the job trains through the failover on any host instead
# of finishing before it; the test opens the gate once it has seen the failover through.
THROTTLE_UNTIL_GATE = throttle_until_gate(0.5)


def test_a_ps_job_trains_through_the_active_rms_death_in_its_attempt_with_its_containers(ps_pair, tmp_path):
    from appmaster.ps.submission import build_ps_submission     # noqa: PLC0415 (the PS AM's deps: this test only)
    from ps_am_status import live_status                        # noqa: PLC0415
    from protocol.ps_status import FINAL_STATUS_FILE, read_status   # noqa: PLC0415

    active, standby = one_active(ps_pair)
    nms: list[NmProcess] = []
    try:
        for i in range(2):
            nms.append(NmProcess(active.conf, tmp_path, f"nm{i}", active.url, memory_mb=2048, vcores=4))
        wait_until(lambda: len(running_nodes(active)) == 2, 30, "both nodes RUNNING", 0.1)
        spec = {"app": "mlr", "workers": 2, "servers": 1, "max_epochs": 60, "convergence_threshold": 1e-12,
                "executor_memory_mb": 320}
        sub = build_ps_submission(spec, name="trains-through-failover", am_memory=384, max_app_attempts=2)
        gate = tmp_path / "gate"
        use_scripted_am(sub, tmp_path, THROTTLE_UNTIL_GATE, {GATE_ENV: str(gate)})
        status, body, _ = call(active.url + "/ws/v1/cluster/apps/new-application", "POST")
        assert status == 200, body
        app_id = str(body["application-id"])
        status, body, _ = call(active.url + "/ws/v1/cluster/apps", "POST", dict(sub, **{"application-id": app_id}))
        assert status == 202, body

        def training(rm: RmProcess, past_epoch: int) -> Any:
            app = app_report(rm, app_id)
            st = live_status(app["trackingUrl"]) if app.get("state") == "RUNNING" and app.get("trackingUrl") else None
            return st if st is not None and (st.epoch or 0) > past_epoch and st.shape is not None \
                and len(st.shape.serving()) == 3 else None
        before = wait_until(lambda: training(active, 1), 180, "the job training with its 3 executors", 0.2)
        assert before.shape is not None
        executors = {e.container_id for e in before.shape.executors}
        job_containers = {cid for nm in nms for cid in nm.containers() if app_id.split("_", 1)[1] in cid}
        am_container = am_containers(active, app_id)
        assert len(am_container) == 1 and job_containers == executors | set(am_container), (job_containers, executors)

        active.signal(signal.SIGKILL)           # the active RM's host dies while the job trains
        assert active.proc is not None and active.proc.wait(10) == -signal.SIGKILL
        epoch_at_kill = before.epoch or 0
        wait_until(lambda: standby.ha_state() == "ACTIVE", 60, f"{standby.rm_id} active after the kill", 0.1)
        # Both nodes resync with their running containers, which the new active re-adopts; the AM
        # registers again and allocates there.
        wait_until(lambda: metric(standby, "elastane_rm_containers_recovered_total") == len(job_containers), 60,
                   "the job's 4 containers re-adopted", 0.2)
        wait_until(lambda: metric(standby, "elastane_rm_am_allocates_total") > 0, 60,
                   "the AM allocating at the new active", 0.2)
        # It trained on meanwhile, with the same executors.
        after = wait_until(lambda: training(standby, epoch_at_kill), 60, "the job training on", 0.2)
        assert after.shape is not None and {e.container_id for e in after.shape.executors} == executors
        gate.touch()

        app = wait_until(lambda: (lambda a: a if a.get("state") in ("FINISHED", "FAILED", "KILLED") else None)(
            app_report(standby, app_id)), 300, f"{app_id} over", 0.5)
        assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
        # One attempt throughout, its AM container the same.
        assert am_containers(standby, app_id) == am_container
        final = read_status((tmp_path / "apps" / app_id / FINAL_STATUS_FILE).read_bytes())
        assert final.attempt_id is not None and final.attempt_id.endswith("_000001") and final.resumed_from is None
        # No executor restarted or replaced: the executors that finished the job are those it had.
        assert final.shape is not None and {e.container_id for e in final.shape.executors} == executors
        assert final.recovery is None or final.recovery.failures == 0
        history = [h.epoch for h in final.objective_history]
        assert history == list(range(60)), history
        # The new term issues ids of its own epoch: none of the old active's comes again.
        other = submit(standby.url)
        new_ids = wait_until(lambda: am_containers(standby, other), 60, "a new app's AM container", 0.2)
        assert new_ids[0].startswith(f"container_e{standby.ha()['epoch']:02d}_")
        assert new_ids[0] not in job_containers
    finally:
        codes = [nm.stop() for nm in nms]
    assert codes == [0, 0], "\n".join(nm.log_tail() for nm in nms)
