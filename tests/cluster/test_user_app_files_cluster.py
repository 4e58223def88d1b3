"""The user story of a user's app with its own data file on a real localhost cluster: the app
(`FILE_LINREG_SOURCE`: opens `linreg.npz` by its relative name) and its data are shipped the YARN
way -- only in the submission's `am-container-spec.local-resources` -- and train to SUCCEEDED (the
AM's executors get the files too); `elastane model evaluate OUTPUT` then runs from another
directory, after the job's files are gone, and prints the job's own final held-out score; a file
missing from the model is a message and exit code 2 naming it; a user app at epoch N of its class's
300 shows N/300 in `ps status`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import app_post_mortem, get_app, pids_with_env, rest, submit_app, wait_app
from polling import wait_until
from ps_am_status import final_status, running_status
from protocol import container_env
from user_app_source import file_linreg_source, write_linreg_data

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def elastane(*args: str, cwd: Path, cluster: Any = None, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    rm = ["--rm", cluster.rm_url, "--user", "alice"] if cluster is not None else []
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", *rm, *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})


def yarn_resource(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"resource": f"file://{path}", "type": "FILE", "visibility": "APPLICATION", "size": st.st_size,
            "timestamp": st.st_mtime_ns // 10**6}


def test_a_user_app_with_its_data_shipped_as_yarn_local_resources_trains_and_its_model_travels(
        cluster: Any, tmp_path: Path) -> None:
    shipped = tmp_path / "client"
    shipped.mkdir()
    (shipped / "digitsapp.py").write_text(file_linreg_source(max_epochs=3))
    write_linreg_data(shipped / "linreg.npz")
    output = tmp_path / "model"
    spec = {"app": "digitsapp:FileLinRegApp", "workers": 2, "servers": 1, "executor_memory_mb": 256,
            "output": str(output)}
    sub = build_ps_submission(spec, name="user-files-yarn-way", am_memory=320)
    assert "local-resources" not in sub["am-container-spec"] and not sub["elastane"]["ps-job"].get("resources")
    sub["am-container-spec"]["local-resources"] = {"entry": [
        {"key": name, "value": yarn_resource(shipped / name)} for name in ("digitsapp.py", "linreg.npz")]}
    app_id = submit_app(cluster.rm_url, sub)
    try:
        app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 240)
    except AssertionError as e:
        e.add_note(app_post_mortem(cluster, app_id))
        raise
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    assert "after 3 epochs" in app["diagnostics"] and "rmse" in app["diagnostics"]
    final = final_status(cluster, app_id)
    assert final.spec is not None and sorted(final.spec.resources) == ["digitsapp.py", "linreg.npz"]   # what the executors got
    assert final.final_metrics is not None
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")

    # The client's files are gone; the model is scored from another directory
    for p in shipped.iterdir():
        p.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = elastane("model", "evaluate", str(output), "--json", cwd=elsewhere)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["rmse"] == pytest.approx(final.final_metrics["rmse"], rel=1e-5)
    shown = elastane("model", "show", str(output), cwd=elsewhere)
    assert "linreg.npz (copied" in shown.stdout and "digitsapp.py (copied" in shown.stdout, shown.stdout

    # A missing input: a message naming it and exit code 2, no traceback
    (output / "final" / "files" / "linreg.npz").unlink()
    r = elastane("model", "evaluate", str(output), cwd=elsewhere)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the job's file 'linreg.npz' is not in the model" in r.stderr and "Traceback" not in r.stderr


def test_a_user_app_at_epoch_n_of_its_classs_300_shows_n_of_300(cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "longapp.py").write_text(file_linreg_source(max_epochs=300))
    # 20,000 rows (200 blocks an epoch): the job must still be training when `ps status` reads it,
    # and at 200 rows its 300 epochs ended first on a loaded machine (the CLI starts slowly there);
    # it is killed once read, so its length costs nothing.
    write_linreg_data(tmp_path / "linreg.npz", rows=20_000, heldout=50)
    r = elastane("ps", "submit", "--app", "longapp:FileLinRegApp", "--py-files", str(tmp_path / "longapp.py"),
                 "--files", str(tmp_path / "linreg.npz"), "--workers", "1", "--servers", "1",
                 "--hparam", "learning_rate=0.0005",      # slow: it trains on while the status is read
                 "--executor-memory", "256", "--am-memory", "320", "--staging-dir", str(tmp_path / "staging"),
                 cwd=tmp_path, cluster=cluster)
    assert r.returncode == 0, r.stdout + r.stderr
    app_id = r.stdout.split()[-1]
    try:
        wait_until(lambda: ((s := running_status(get_app(cluster.rm_url, app_id))) and s.epoch or 0) >= 2, 180,
                   "two epochs trained")
        r = elastane("ps", "status", app_id, cwd=tmp_path, cluster=cluster)
        assert r.returncode == 0, r.stderr
        report = {k.strip(): v.strip() for k, sep, v in (ln.partition(" : ") for ln in r.stdout.splitlines()) if sep}
        done, limit = report["Epoch"].split()[0].split("/")
        assert int(done) >= 2 and limit == "300", report["Epoch"]
        assert report["ETA"].startswith("<= ") and report["ETA"] != "<= 0.0s", report["ETA"]
    finally:
        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_app(cluster.rm_url, app_id, ("KILLED",), 60)
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
