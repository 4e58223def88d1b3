"""bin/ scripts: usage errors, and a real start-cluster / stop-cluster over a localhost hosts file."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from elastane_cli import processes

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "bin"


def script(name: str, *args: str, env: dict[str, str] | None = None,
           timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


@pytest.mark.parametrize("name, args", [
    ("start-cluster", []),
    ("start-cluster", ["/nonexistent/hosts"]),
    ("start-cluster", ["hosts", "extra"]),
    ("stop-cluster", ["a", "b"]),
    ("stop-cluster", ["/nonexistent/hosts"]),
    ("elastane-daemon", ["start"]),
    ("elastane-daemon", ["start", "jobtracker"]),
    ("elastane-daemon", ["restart", "rm"]),
])
def test_bad_usage_exits_2(name: str, args: list[str], tmp_path: Path) -> None:
    if args[:1] == ["hosts"]:
        (tmp_path / "hosts").write_text("localhost\n")
        args = [str(tmp_path / "hosts"), *args[1:]]
    r = script(name, *args, env={"ELASTANE_PID_DIR": str(tmp_path / "pids")})
    assert r.returncode == 2
    assert "usage:" in r.stderr or "cannot read hosts file" in r.stderr


def test_stop_and_status_without_daemons(tmp_path: Path) -> None:
    env = {"ELASTANE_PID_DIR": str(tmp_path / "pids")}
    assert script("elastane-daemon", "status", "rm", env=env).returncode == 1
    r = script("stop-cluster", env=env)
    assert r.returncode == 0 and "no nm to stop" in r.stdout and "no rm to stop" in r.stdout


def test_a_stale_pid_file_naming_another_process_is_not_signalled(tmp_path: Path) -> None:
    """A pid file left behind (a killed host) whose number now runs another `-m rm` process -- not
    this daemon, started without its ready file -- is neither stopped nor taken as running."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "rm"])
    try:
        pids = tmp_path / "pids"
        pids.mkdir()
        env = {"ELASTANE_PID_DIR": str(pids), "ELASTANE_IDENT_STRING": "test"}
        (pids / f"elastane-test-rm-{socket.gethostname()}.pid").write_text(f"{other.pid}\n")
        assert script("elastane-daemon", "status", "rm", env=env).returncode == 1
        r = script("elastane-daemon", "stop", "rm", env=env)
        assert r.returncode == 0 and "no rm to stop" in r.stdout, r.stdout + r.stderr
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.cluster
@pytest.mark.skipif(not ((ROOT / "rm" / "__main__.py").exists() and (ROOT / "nodemanager" / "__main__.py").exists()),
                    reason="python -m rm / nodemanager not available yet")
def test_start_cluster_and_stop_cluster_on_localhost(tmp_path: Path) -> None:
    port = _free_port()
    conf = tmp_path / "conf"
    conf.mkdir()
    # Own conf dir: the repo's conf/cluster.toml must not get this test's secret.
    (conf / "cluster.toml").write_text(f'[cluster]\nsecret = ""\nrm_address = "http://127.0.0.1:{port}"\n')
    rm_flags = ["--port", str(port), "--host", "127.0.0.1", "--state-dir", str(tmp_path / "rm")]
    nm_flags = ["--port", "0", "--host", "127.0.0.1", "--memory-mb", "512", "--vcores", "1", "--cgroups", "off",
                "--local-dir", str(tmp_path / "nm/local"), "--log-dir", str(tmp_path / "nm/logs"),
                "--recovery-dir", str(tmp_path / "nm/recovery")]
    env = {"ELASTANE_PID_DIR": str(tmp_path / "pids"), "ELASTANE_LOG_DIR": str(tmp_path / "logs"),
           "ELASTANE_CONF_DIR": str(conf), "ELASTANE_IDENT_STRING": "test",
           "ELASTANE_RM_OPTS": " ".join(rm_flags)}
    hosts = tmp_path / "hosts"
    hosts.write_text("# workers\nlocalhost   # this machine\n\n127.0.0.1\n")
    pids: list[tuple[int, int | None]] = []
    try:
        r = script("start-cluster", str(hosts), "--", *nm_flags, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        text = (conf / "cluster.toml").read_text()
        assert 'secret = "' in text and 'secret = ""' not in text
        pids = [(p, processes.proc_start_ticks(p)) for p in (
            int((tmp_path / "pids" / f"elastane-test-{d}-{socket.gethostname()}.pid").read_text()) for d in ("rm", "nm"))]
        assert all(processes.is_alive(p, t) for p, t in pids)
        ready = json.loads((tmp_path / "pids" / f"elastane-test-nm-{socket.gethostname()}.ready").read_text())
        assert ready["node_id"]
        again = script("start-nm", *nm_flags, env=env)
        assert again.returncode == 1 and "already running" in again.stderr
        r = script("stop-cluster", str(hosts), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert processes.wait_gone(pids, 10.0) == []
        assert not (tmp_path / "pids" / f"elastane-test-rm-{socket.gethostname()}.pid").exists()
    finally:
        # Whatever start-cluster got to start (also when it failed half-way): stopped through its
        # pid files, which name only processes it started; then any left, by pid and start time.
        script("stop-cluster", str(hosts), env=env)
        for p, t in pids:
            processes.signal_pid(p, 9, t)
