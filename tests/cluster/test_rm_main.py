"""`python -m rm` as a process: ready file, REST answers, clean SIGTERM; bad flags exit 2."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from polling import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _rm(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rm", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_runs_serves_and_stops_on_sigterm(tmp_path):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[cluster]\nsecret = ""\n')
    ready = tmp_path / "ready.json"
    proc = _rm(tmp_path, "--cluster-config", str(cluster), "--host", "127.0.0.1", "--port", "0",
               "--state-dir", str(tmp_path / "state"), "--ready-file", str(ready))
    try:
        def ready_or_dead() -> bool:
            assert proc.poll() is None, proc.communicate()[1]
            return ready.exists()
        wait_until(ready_or_dead, 30, "the RM's ready file", interval_s=0.05)
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid and info["url"].startswith("http://127.0.0.1:")
        with urllib.request.urlopen(info["url"] + "/ws/v1/cluster/info", timeout=10) as r:
            assert json.load(r)["clusterInfo"]["state"] == "STARTED"
        assert 'secret = "' in cluster.read_text() and 'secret = ""' not in cluster.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert (tmp_path / "state" / "state.db").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_ready_file_names_the_cluster_rm_address_not_the_bind_address(tmp_path):
    cluster = tmp_path / "cluster.toml"
    # 127.0.0.2: reachable here, and neither the bind address nor what a host name maps to.
    cluster.write_text('[cluster]\nsecret = "s"\nrm_address = "http://127.0.0.2:8088"\n')
    ready = tmp_path / "ready.json"
    proc = _rm(tmp_path, "--cluster-config", str(cluster), "--host", "0.0.0.0", "--port", "0",
               "--state-dir", str(tmp_path / "state"), "--ready-file", str(ready))
    try:
        def ready_or_dead() -> bool:
            assert proc.poll() is None, proc.communicate()[1]
            return ready.exists()
        wait_until(ready_or_dead, 30, "the RM's ready file", interval_s=0.05)
        info = json.loads(ready.read_text())
        port = int(info["http_address"].rsplit(":", 1)[1])
        assert info["url"] == f"http://127.0.0.2:{port}" and info["http_address"] == f"127.0.0.2:{port}"
        with urllib.request.urlopen(info["url"] + "/ws/v1/cluster/info", timeout=10) as r:
            assert json.load(r)["clusterInfo"]["state"] == "STARTED"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("args,needle", [
    (["--port", "notaport"], "invalid int"),
    (["--policy", "nope"], "unknown policy"),
    (["--nm-expiry-s", "-1"], "positive"),
    (["--config", "/nonexistent/rm.toml"], "does not exist"),
])
def test_bad_flags_exit_2(tmp_path, args, needle):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[cluster]\nsecret = "s"\n')
    proc = _rm(tmp_path, "--cluster-config", str(cluster), "--state-dir", str(tmp_path / "s"), *args)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and needle in err


def test_bad_config_file_exits_2(tmp_path):
    conf = tmp_path / "rm.toml"
    conf.write_text("[rm]\nbogus_key = 1\n")
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[cluster]\nsecret = "s"\n')
    proc = _rm(tmp_path, "--config", str(conf), "--cluster-config", str(cluster))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "bogus_key" in err
