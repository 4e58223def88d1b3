"""`elastane ps submit --wait` and `elastane ps status` end to end on a real localhost cluster
(RM + 3 NMs as processes): a tiny MLR job trains, the command exits 0 and prints the final
objective and held-out metrics, the status of the finished job is what the RM knows, and the AM's
final status.json decodes as the PsStatus record its /status served, saying the same."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import get_app, pids_with_env
from polling import wait_until
from ps_am_status import final_status
from protocol import container_env

pytestmark = pytest.mark.cluster


def elastane(cluster: Any, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", "--rm", cluster.rm_url, "--user", "alice",
                           *args], capture_output=True, text=True, timeout=timeout_s)


def report(out: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, sep, v in (ln.partition(" : ") for ln in out.splitlines()) if sep}


def final_report_line(out: str) -> str:
    """The held-out metrics line `ps submit --wait` ends with."""
    return report(out)["Held-Out-Metrics"]


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

    # The AM's durable final status is the record /status served, decoded as such.
    durable = final_status(cluster, app_id)
    assert (durable.app, durable.application_id, durable.state) == ("mlr", app_id, "SUCCEEDED")
    assert (durable.epoch, durable.max_epochs, durable.stop_criterion) == (4, 4, "epoch limit")
    assert durable.spec is not None and (durable.spec.workers, durable.spec.servers) == (2, 1)
    assert [e.epoch for e in durable.objective_history] == [0, 1, 2, 3]
    last = durable.objective_history[-1].objective
    assert last is not None and f"{last:.6g}" == objective
    assert durable.checkpoints and durable.checkpoints[-1].epoch == 4 and Path(durable.checkpoints[-1].dir).is_dir()
    assert durable.final_metrics is not None
    assert f"accuracy {durable.final_metrics['accuracy']:.4g}" in final_report_line(r.stdout)
    assert durable.shape is not None and sorted(e.role for e in durable.shape.executors) == ["server", "worker", "worker"]
    assert durable.shape_history == [] and durable.recovery is not None and durable.recovery.failures == 0
    assert set(durable.metrics.workers) == {"worker-0", "worker-1"} and durable.eps is not None
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
