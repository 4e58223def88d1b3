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
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

import etcd_server as etcdmod
from polling import wait_until
from s3_server import free_ports

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


def write_conf(conf: Path, etcd_endpoint: str, ports: list[int], extra: str = "") -> None:
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "rm.toml").write_text("[rm]\nnm_expiry_s = 600.0\nam_expiry_s = 600.0\n")
    addresses = ", ".join(f'rm{i + 1} = "http://127.0.0.1:{p}"' for i, p in enumerate(ports))
    (conf / "cluster.toml").write_text(
        f'[cluster]\nsecret = "{os.urandom(16).hex()}"\nrm_address = "http://127.0.0.1:{ports[0]}"\n\n'
        f'[ha]\nenabled = true\nrm_ids = [{", ".join(f"{chr(34)}rm{i + 1}{chr(34)}" for i in range(len(ports)))}]\n'
        f'rm_addresses = {{ {addresses} }}\netcd_endpoints = ["{etcd_endpoint}"]\nlease_s = {LEASE_S}\n{extra}')


@pytest.fixture
def pair(etcd: Any, tmp_path: Path) -> Iterator[tuple[RmProcess, RmProcess]]:
    ports = free_ports(2)
    write_conf(tmp_path / "conf", etcd.endpoint, ports)
    rms = (RmProcess("rm1", ports[0], tmp_path / "conf", tmp_path), RmProcess("rm2", ports[1], tmp_path / "conf", tmp_path))
    try:
        for rm in rms:
            rm.start()
        yield rms
    finally:
        for rm in rms:
            rm.stop()


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


def test_a_nodemanager_fails_over_to_the_new_active(pair, tmp_path):
    active, standby = one_active(pair)
    conf = active.conf
    (conf / "nm.toml").write_text("[nm]\nwarm_modules = []\ncontainer_shells = 0\narbiter = false\n")
    ready = tmp_path / "nm.ready"
    log = open(tmp_path / "nm.log", "ab")
    nm = subprocess.Popen(
        [sys.executable, "-m", "nodemanager", "--config", str(conf / "nm.toml"), "--cluster-config",
         str(conf / "cluster.toml"), "--rm-address", active.url, "--host", "127.0.0.1", "--port", "0",
         "--memory-mb", "1024", "--vcores", "2", "--local-dir", str(tmp_path / "nm-local"),
         "--log-dir", str(tmp_path / "nm-logs"), "--recovery-dir", str(tmp_path / "nm-recovery"),
         "--cgroups", "off", "--heartbeat-interval-ms", "200", "--ready-file", str(ready)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    try:
        wait_until(lambda: nm.poll() is None and ready.exists(), 60, "the NM registered", 0.1)
        node_id = json.loads(ready.read_text())["node_id"]
        wait_until(lambda: running_nodes(active) == [node_id], 30, "the node RUNNING at the active", 0.1)
        app_id = submit(active.url)
        first = wait_until(lambda: am_containers(active, app_id), 30, "the AM container allocated")
        epoch = active.ha()["epoch"]
        assert first[0].startswith(f"container_e{epoch:02d}_"), first      # YARN's form, the term's epoch
        active.signal(signal.SIGKILL)
        assert active.proc is not None and active.proc.wait(10) == -signal.SIGKILL
        wait_until(lambda: standby.ha_state() == "ACTIVE", 60, f"{standby.rm_id} active", 0.1)
        # Its heartbeats move on to the new active, which answers RESYNC; the node registers there.
        wait_until(lambda: running_nodes(standby) == [node_id], 60, "the node RUNNING at the new active", 0.1)
        # The recovered app's new attempt gets its AM container in the new term: a new epoch, so
        # no id the old active issued comes again.
        ids = wait_until(lambda: (lambda c: c if len(c) == 2 else None)(am_containers(standby, app_id)), 60,
                         "the new attempt's AM container")
        assert ids[0] == first[0] and ids[1].startswith(f"container_e{standby.ha()['epoch']:02d}_")
        assert standby.ha()["epoch"] > epoch and len(set(ids)) == 2
    finally:
        if nm.poll() is None:
            nm.send_signal(signal.SIGTERM)
            try:
                nm.wait(30)
            except subprocess.TimeoutExpired:
                nm.kill()
                nm.wait(10)
    assert nm.returncode == 0, (tmp_path / "nm.log").read_text()[-3000:]
