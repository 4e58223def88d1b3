"""`elastane ps submit --wait` and `elastane ps status` end to end on a real localhost cluster
(RM + 3 NMs as processes): a tiny MLR job trains, the command exits 0 and prints the final
objective and held-out metrics, and the status of the finished job is what the RM knows."""
from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

from conftest import get_app, pids_with_env
from polling import wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


def elastane(cluster: Any, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", "--rm", cluster.rm_url, "--user", "alice",
                           *args], capture_output=True, text=True, timeout=timeout_s)


def report(out: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, sep, v in (ln.partition(" : ") for ln in out.splitlines()) if sep}


def test_ps_submit_wait_trains_a_tiny_mlr_job_and_prints_its_result(cluster: Any) -> None:
    r = elastane(cluster, "ps", "submit", "--app", "mlr", "--workers", "2", "--servers", "1", "--max-epochs", "4",
                 "--hparam", "learning_rate=0.5", "--executor-memory", "256", "--am-memory", "320",
                 "--name", "cli-ps-e2e", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    app_id = lines[0].split()[-1]
    assert lines[0] == f"Submitted application {app_id}"
    assert any(ln.startswith("epoch ") and "/4 [" in ln for ln in lines), r.stdout   # the progress bar
    final = report(r.stdout)
    assert final["Final-Status"] == "FINISHED/SUCCEEDED"
    m = re.match(r"(\S+) after 4 epochs", final["Final-Objective"])
    assert m, r.stdout
    objective = m.group(1)
    assert 0 < float(objective) < 1.609                       # below log(5), the untrained objective
    assert "accuracy" in final["Held-Out-Metrics"]

    app = get_app(cluster.rm_url, app_id)
    assert (app["user"], app["name"], app["applicationType"]) == ("alice", "cli-ps-e2e", "ELASTANE_PS")
    assert app["elastane"]["ps-job"]["workers"] == 2

    s = elastane(cluster, "ps", "status", app_id, timeout_s=30)
    assert s.returncode == 0, s.stderr
    status = report(s.stdout)
    assert (status["State"], status["Final-Status"]) == ("FINISHED", "SUCCEEDED")
    assert status["Final-Objective"] == f"{objective} after 4 epochs"
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
