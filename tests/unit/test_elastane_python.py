"""ELASTANE_PYTHON: the interpreter bin/elastane-daemon and bin/start-rm run, carried over ssh by
bin/start-cluster (bin/hosts.sh remote_env) and set by TestbedCluster for the master's shell."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def wrapper(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter that notes each call (its arguments) and then runs this test's Python."""
    calls = tmp_path / "calls"
    py = tmp_path / "python-wrapper"
    py.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    return py, calls


def test_the_daemon_script_runs_the_named_interpreter(tmp_path: Path) -> None:
    py, calls = wrapper(tmp_path)
    env = {**os.environ, "ELASTANE_PYTHON": str(py), "ELASTANE_PID_DIR": str(tmp_path / "pids"),
           "ELASTANE_LOG_DIR": str(tmp_path / "logs")}
    r = subprocess.run([str(ROOT / "bin" / "elastane-daemon"), "start", "rm", "--foreground", "--help"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower()
    assert calls.read_text().split()[:2] == ["-m", "rm"]


def test_a_named_interpreter_that_does_not_exist_stops_the_start_naming_the_setting(tmp_path: Path) -> None:
    env = {**os.environ, "ELASTANE_PYTHON": str(tmp_path / "no-python")}
    for script in ("elastane-daemon", "start-rm"):
        args = ["start", "nm"] if script == "elastane-daemon" else []
        r = subprocess.run([str(ROOT / "bin" / script), *args], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "ELASTANE_PYTHON" in r.stderr, (script, r.stderr)


def test_start_cluster_carries_the_interpreter_over_ssh(tmp_path: Path) -> None:
    r = subprocess.run(["bash", "-c", f"source {ROOT / 'bin' / 'hosts.sh'}; remote_env node1"],
                       env={**os.environ, "ELASTANE_PYTHON": "/opt/py/bin/python"}, capture_output=True, text=True)
    assert "ELASTANE_PYTHON=/opt/py/bin/python" in r.stdout and "ELASTANE_HOSTNAME=node1" in r.stdout


def test_the_testbed_clusters_master_shell_has_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elastane_cli.testbed_cluster import TestbedCluster
    c = TestbedCluster(tmp_path, workers=1)
    monkeypatch.delenv("ELASTANE_PYTHON", raising=False)
    assert "ELASTANE_PYTHON" not in c.env()
    monkeypatch.setenv("ELASTANE_PYTHON", "/opt/py/bin/python")
    assert c.env()["ELASTANE_PYTHON"] == "/opt/py/bin/python"
