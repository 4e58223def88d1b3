"""A user's own app on a real localhost cluster: `elastane ps submit --app mymodel:LinRegApp
--py-files mymodel.py` trains it to SUCCEEDED; a bug in its compute fails the job FAILED with the
user's traceback in the diagnostics, after one attempt (no retry, no replacement of executors)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import get_app, pids_with_env, rest
from polling import wait_until
from protocol import container_env
from user_app_source import linreg_source

pytestmark = pytest.mark.cluster


def elastane(cluster: Any, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", "--rm", cluster.rm_url, "--user", "alice",
                           *args], capture_output=True, text=True, timeout=timeout_s)


def submit(cluster: Any, module: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], str]:
    r = elastane(cluster, "ps", "submit", "--app", f"{module.stem}:LinRegApp", "--py-files", str(module),
                 "--workers", "2", "--servers", "1", "--executor-memory", "256", "--am-memory", "320",
                 "--staging-dir", str(module.parent / "staging"), *extra, "--wait")
    first = r.stdout.splitlines()[0] if r.stdout else ""
    assert first.startswith("Submitted application "), r.stdout + r.stderr
    return r, first.split()[-1]


def test_a_user_app_shipped_with_py_files_trains_and_succeeds(cluster: Any, tmp_path: Path) -> None:
    module = tmp_path / "mymodel.py"
    module.write_text(linreg_source())
    output = tmp_path / "model"
    r, app_id = submit(cluster, module, "--max-epochs", "3", "--set", f"output={output}")
    assert r.returncode == 0, r.stdout + r.stderr
    app = get_app(cluster.rm_url, app_id)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    assert "after 3 epochs" in app["diagnostics"] and "rmse" in app["diagnostics"]
    resources = app["elastane"]["ps-job"]["resources"]
    staged = tmp_path / "staging" / "alice" / app_id / "mymodel.py"
    assert resources["mymodel.py"]["resource"] == str(staged) and staged.read_text() == module.read_text()
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
    # The model carries the app's code: it loads and scores where the module is not installed
    # (another dir, the user's file gone), with the job's own final held-out score.
    module.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    score = subprocess.run([sys.executable, "-c", "import elastane, json, sys; "
                            "print(json.dumps(elastane.load_model(sys.argv[1]).evaluate()))", str(output)],
                           capture_output=True, text=True, timeout=120, cwd=elsewhere)
    assert score.returncode == 0, score.stderr
    assert (output / "final" / "files" / "mymodel.py").read_text() == staged.read_text()
    rmse = json.loads(score.stdout)["rmse"]
    assert f"rmse {rmse:.4g}" in app["diagnostics"] or f"rmse {rmse:.3f}" in app["diagnostics"], \
        (rmse, app["diagnostics"])


def test_a_user_apps_bug_fails_the_job_with_its_traceback_and_no_retry(cluster: Any, tmp_path: Path) -> None:
    module = tmp_path / "buggy.py"
    module.write_text(linreg_source(fail_in_compute=True))
    r, app_id = submit(cluster, module, "--max-epochs", "3", "--max-attempts", "2")
    assert r.returncode != 0
    app = get_app(cluster.rm_url, app_id)
    assert app["finalStatus"] == "FAILED"
    diagnostics = app["diagnostics"]
    assert "user code failed" in diagnostics, diagnostics
    assert "ZeroDivisionError: linreg: a bug in the user's compute" in diagnostics
    assert "Traceback" in diagnostics and "buggy.py" in diagnostics
    attempts = rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/appattempts")
    assert len(attempts["appAttempts"]["appAttempt"]) == 1, attempts
    wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")


def test_a_user_apps_bad_hparams_are_refused_before_submission(cluster: Any, tmp_path: Path) -> None:
    module = tmp_path / "mymodel.py"
    module.write_text(linreg_source())
    r = elastane(cluster, "ps", "submit", "--app", "mymodel:LinRegApp", "--py-files", str(module),
                 "--hparam", "learning_rate=-1", timeout_s=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "invalid PS job spec" in r.stderr and "learning_rate" in r.stderr
    assert "Submitted" not in r.stdout
