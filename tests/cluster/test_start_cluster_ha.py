"""bin/start-cluster and bin/stop-cluster with cluster.toml's [ha]: every listed ResourceManager is
started (each with its id, its own pid and log files) and they elect one active on a real etcd; the
NM registers with the active; stop-cluster stops every RM by its pid. Bad [ha] settings stop
start-cluster before anything starts, naming the setting (exit 2). Localhost, as the plain
start-cluster test in test_cli_scripts.py runs."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import pytest

import etcd_server as etcdmod
from elastane_cli import processes
from polling import wait_until
from s3_server import free_ports

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "bin"
HOST = socket.gethostname()

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(etcdmod.unavailable_reason() is not None,
                                 reason=f"no etcd here: {etcdmod.unavailable_reason()}")]


def script(name: str, *args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **env))


def get(url: str) -> Optional[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{url}?user.name=alice", timeout=5) as r:
            body: dict[str, Any] = json.loads(r.read())
            return body
    except (urllib.error.URLError, OSError, ValueError):
        return None


def write_conf(conf: Path, rm_ids: list[str], ports: list[int], etcd: list[str], state_dir: Path) -> None:
    conf.mkdir(parents=True, exist_ok=True)
    addresses = ", ".join(f'{i} = "http://127.0.0.1:{p}"' for i, p in zip(dict.fromkeys(rm_ids), ports))
    (conf / "cluster.toml").write_text(
        f'[cluster]\nsecret = ""\nrm_address = "http://127.0.0.1:{ports[0]}"\n\n'
        f'[ha]\nenabled = true\nrm_ids = {json.dumps(rm_ids)}\nrm_addresses = {{ {addresses} }}\n'
        f'etcd_endpoints = {json.dumps(etcd)}\nlease_s = 2\n')
    (conf / "rm.toml").write_text(f'[rm]\nstate_dir = "{state_dir}"\nnm_expiry_s = 600.0\n')


def env_for(tmp_path: Path) -> dict[str, str]:
    return {"ELASTANE_PID_DIR": str(tmp_path / "pids"), "ELASTANE_LOG_DIR": str(tmp_path / "logs"),
            "ELASTANE_CONF_DIR": str(tmp_path / "conf"), "ELASTANE_IDENT_STRING": "test",
            "ELASTANE_RM_OPTS": "--host 127.0.0.1"}


def pid_file(tmp_path: Path, name: str) -> Path:
    return tmp_path / "pids" / f"elastane-test-{name}-{HOST}.pid"


def test_start_cluster_starts_every_listed_rm_and_stop_cluster_stops_them(etcd: Any, tmp_path: Path) -> None:
    ports = free_ports(2)
    write_conf(tmp_path / "conf", ["rm1", "rm2"], ports, [etcd.endpoint], tmp_path / "rm")
    env = env_for(tmp_path)
    nm_flags = ["--port", "0", "--host", "127.0.0.1", "--memory-mb", "512", "--vcores", "1", "--cgroups", "off",
                "--local-dir", str(tmp_path / "nm/local"), "--log-dir", str(tmp_path / "nm/logs"),
                "--recovery-dir", str(tmp_path / "nm/recovery")]
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    pids: list[tuple[int, int | None]] = []
    try:
        r = script("start-cluster", str(hosts), "--", *nm_flags, env=env)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "rm1 (127.0.0.1): " in out and "rm2 (127.0.0.1): " in out
        text = (tmp_path / "conf" / "cluster.toml").read_text()
        assert 'secret = "' in text and 'secret = ""' not in text
        # Each RM has its own pid and log file, named by its id, and runs with that id.
        rm_pids = {i: int(pid_file(tmp_path, f"rm-{i}").read_text()) for i in ("rm1", "rm2")}
        nm_pid = int(pid_file(tmp_path, "nm").read_text())
        pids = [(p, processes.proc_start_ticks(p)) for p in (*rm_pids.values(), nm_pid)]
        assert all(processes.is_alive(p, t) for p, t in pids)
        assert len(set(rm_pids.values())) == 2
        for i in ("rm1", "rm2"):
            assert (tmp_path / "logs" / f"elastane-test-rm-{i}-{HOST}.log").exists()
        urls = {i: f"http://127.0.0.1:{p}" for i, p in zip(("rm1", "rm2"), ports)}

        def roles() -> Optional[dict[str, str]]:
            got = {i: ((get(u + "/ws/v1/cluster/info") or {}).get("clusterInfo") or {}).get("haState", "")
                   for i, u in urls.items()}
            return got if sorted(got.values()) == ["ACTIVE", "STANDBY"] else None
        states = wait_until(roles, 60, "one RM active, the other standby", 0.1)
        active = next(i for i, s in states.items() if s == "ACTIVE")
        # The NM (its rm_address is rm1's) registers with whichever is active.
        wait_until(lambda: [n for n in ((get(urls[active] + "/ws/v1/cluster/nodes") or {}).get("nodes") or {})
                            .get("node", []) if n.get("state") == "RUNNING"],
                   60, f"the NM RUNNING at the active {active}", 0.1)

        again = script("start-rm", "--rm-id", "rm1", env=env)
        assert again.returncode == 1 and "rm-rm1 is already running" in again.stderr

        r = script("stop-cluster", str(hosts), env=env)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        # The standby is stopped first, the active last (nobody is left to take the key over). The
        # active is the one the script found when it stopped them: on a loaded machine a lease can
        # have moved since `roles` looked (an RM paused past its lease steps down), so the order is
        # checked against what the script says it saw, which must name one ACTIVE and one STANDBY.
        m = re.search(r"^stop order: (rm\d) \((\w+)\), (rm\d) \((\w+)\)$", out, re.M)
        assert m and (m[2], m[4]) == ("STANDBY", "ACTIVE"), out
        assert out.index(f"stopping rm-{m[1]}") < out.index(f"stopping rm-{m[3]}"), out
        assert processes.wait_gone(pids, 30.0) == []
        assert not any(pid_file(tmp_path, f"rm-{i}").exists() for i in ("rm1", "rm2"))
        assert not pid_file(tmp_path, "nm").exists()
    finally:
        # Whatever start-cluster got to start (also when it failed half-way), through its pid
        # files; then any left, by pid and start time.
        script("stop-cluster", str(hosts), env=env)
        for p, t in pids:
            processes.signal_pid(p, 9, t)


@pytest.mark.parametrize("rm_ids, etcd_endpoints, setting", [
    (["rm1", "rm2"], [], "etcd_endpoints"),
    (["rm1", "rm1"], ["http://127.0.0.1:2379"], "rm_ids"),
])
def test_bad_ha_settings_stop_start_cluster_naming_the_setting(rm_ids: list[str], etcd_endpoints: list[str],
                                                                setting: str, tmp_path: Path) -> None:
    ports = free_ports(2)
    write_conf(tmp_path / "conf", rm_ids, ports, etcd_endpoints, tmp_path / "rm")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    env = env_for(tmp_path)
    before = (tmp_path / "conf" / "cluster.toml").read_text()
    r = script("start-cluster", str(hosts), env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"[ha] {setting}:" in r.stderr and "nothing started" in r.stderr
    # Nothing started, nothing written: no pid file, no log, the secret still empty.
    assert not (tmp_path / "pids").exists() and not (tmp_path / "logs").exists()
    assert (tmp_path / "conf" / "cluster.toml").read_text() == before
    r = script("stop-cluster", str(hosts), env=env)
    assert r.returncode == 2 and f"[ha] {setting}:" in r.stderr
