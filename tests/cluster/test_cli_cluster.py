"""End to end: `elastane cluster start` in the background, then the CLI against the real daemons."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_app
from elastane_cli import processes
from elastane_cli.local_cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not ((ROOT / "rm" / "__main__.py").exists() and (ROOT / "nodemanager" / "__main__.py").exists()),
                       reason="python -m rm / nodemanager not available yet"),
]


def elastane(*args: str, rm: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "elastane_cli.main"] + (["--rm", rm] if rm else []) + list(args)
    env = dict(os.environ)
    env.pop("ELASTANE_RM", None)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def submitted_id(out: str) -> str:
    m = re.search(r"Submitted application (application_\d+_\d+)", out)
    assert m, out
    return m.group(1)


def test_cluster_start_run_logs_kill_stop(tmp_path: Path) -> None:
    base = tmp_path / "cluster"
    started = elastane("cluster", "start", "--dir", str(base), "--nodes", "2", "--rm-port", "0",
                       "--node-memory", "1024", "--node-vcores", "2", "--heartbeat-interval-ms", "250")
    try:
        assert started.returncode == 0, started.stderr
        rm = started.stdout.strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", rm)
        state = json.loads((base / "cluster.json").read_text())
        pids = [state["rm_pid"]] + [n["pid"] for n in state["nodes"]]
        assert all(processes.is_alive(p) for p in pids)  # outlived the CLI that started them

        nodes = elastane("node", "list", rm=rm)
        assert nodes.returncode == 0, nodes.stderr
        rows = nodes.stdout.splitlines()[1:-1]
        assert len(rows) == 2 and all(r.split()[1] == "RUNNING" for r in rows)

        ok = elastane("app", "run", "-n", "2", "--memory", "128", "--vcores", "1", "--",
                      "python", "-c", "print(42)", rm=rm)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        app_id = submitted_id(ok.stdout)
        assert "FINISHED with final status SUCCEEDED" in ok.stdout

        logs = elastane("app", "logs", app_id, "--file", "stdout", rm=rm)
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout.count("\n42\n") >= 2, logs.stdout

        bad = elastane("app", "run", "--memory", "128", "--", "python", "-c", "import sys; sys.exit(3)", rm=rm)
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "final status FAILED" in bad.stdout

        long = elastane("app", "run", "--no-wait", "--memory", "128", "--", "sleep", "300", rm=rm)
        assert long.returncode == 0, long.stderr
        long_id = submitted_id(long.stdout)
        killed = elastane("app", "kill", long_id, rm=rm)
        assert killed.returncode == 0, killed.stderr
        assert f"Killed application {long_id}" in killed.stdout
        status = elastane("app", "status", long_id, rm=rm)
        assert re.search(r"^State\s+: KILLED$", status.stdout, re.M), status.stdout

        # YARN's application lifetime: the RM kills an app still running at its expiry
        timed = elastane("app", "run", "--lifetime", "2", "--memory", "128", "--", "sleep", "300", rm=rm)
        assert timed.returncode == 1, timed.stdout + timed.stderr
        assert "KILLED with final status KILLED" in timed.stdout and "timed out" in timed.stdout, timed.stdout
        later = elastane("app", "run", "--no-wait", "--lifetime", "600", "--memory", "128", "--", "sleep", "300", rm=rm)
        later_id = submitted_id(later.stdout)
        status = elastane("app", "status", later_id, rm=rm)
        assert re.search(r"^Lifetime\s+: expires \S+ \(\d+m\d+s left\)$", status.stdout, re.M), status.stdout
        nowhere = elastane("app", "move-to-queue", later_id, "nope", rm=rm)
        assert nowhere.returncode == 2 and "unknown queue 'nope'" in nowhere.stderr, nowhere.stderr
        same = elastane("app", "move-to-queue", later_id, "default", rm=rm)
        assert same.returncode == 0 and f"Moved {later_id} to queue default" in same.stdout, same.stderr
        moved = elastane("app", "update-lifetime", later_id, "1", rm=rm)
        assert moved.returncode == 0 and f"Updated the lifetime of {later_id}" in moved.stdout, moved.stderr
        ended = wait_app(rm, later_id, ("KILLED",), 60)     # polls the RM's REST API
        assert "timed out" in ended["diagnostics"], ended

        missing = elastane("app", "status", app_id[:-4] + "9999", rm=rm)
        assert missing.returncode == 2 and missing.stderr.startswith("elastane: error:")

        listed = elastane("app", "list", "--state", "FINISHED,KILLED", rm=rm)
        assert listed.returncode == 0 and app_id in listed.stdout and long_id in listed.stdout

        stopped = elastane("cluster", "stop", "--dir", str(base))
        assert stopped.returncode == 0, stopped.stderr
        assert not any(processes.is_alive(p) for p in pids)
    finally:
        if (base / "cluster.json").exists():
            LocalCluster.load(base).stop()
