"""bin/elastane-daemon's pid file: found by start, status and stop alike, whatever dir each is run
from, and a running daemon refuses a second start, a foreground one too.

The daemon is a stand-in interpreter (ELASTANE_PYTHON) that writes its ready file and waits for
SIGTERM: what the script checks of a daemon is its command line, its pid file and its ready file."""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DAEMON = str(ROOT / "bin" / "elastane-daemon")

FAKE = """#!/bin/bash
while [[ $# -gt 0 ]]; do
  if [[ $1 == --ready-file ]]; then echo '{"fake": true}' > "$2"; fi
  shift
done
sleep 60 &
child=$!
trap 'kill $child; exit 0' TERM
wait
"""


def run(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DAEMON, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_a_relative_pid_dir_is_the_callers_for_start_status_and_stop(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = {**os.environ, "ELASTANE_PYTHON": str(fake), "ELASTANE_PID_DIR": "pids",
           "ELASTANE_LOG_DIR": "logs", "ELASTANE_IDENT_STRING": "pidtest"}
    pid_file = tmp_path / "pids" / f"elastane-pidtest-nm-{socket.gethostname()}.pid"
    started = run(tmp_path, env, "start", "nm")
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    try:
        assert started.returncode == 0, started.stderr
        # Where the caller named it (not under the project's root, where start runs the daemon).
        assert pid is not None and not (ROOT / "pids").exists()
        status = run(tmp_path, env, "status", "nm")
        assert status.returncode == 0 and f"process {pid}" in status.stdout
        again = run(tmp_path, env, "start", "nm", "--foreground")
        assert again.returncode == 1 and "already running" in again.stderr
        stopped = run(tmp_path, env, "stop", "nm")
        assert stopped.returncode == 0 and f"stopping nm (pid {pid})" in stopped.stdout
        assert not pid_file.exists()
    finally:
        if pid is not None:
            try:
                os.kill(pid, 15)    # its trap ends its sleep too
            except ProcessLookupError:
                pass
