"""PS jobs whose every location is an s3:// URL on a real S3 server (SeaweedFS on loopback), on a
localhost cluster whose daemons learn the endpoint and keys from their environment (the standard
AWS variables; each NM passes them into the containers it starts): the RM's `checkpoint_dir`,
`data.path`, `output` -- loaded back and scored from S3 -- and a second job's `init_from`; a user
app whose module and data file reach the AM and every executor only through the client's
`--staging-dir` in S3. A missing bucket or a client with wrong keys is refused at
submission with exit code 2 naming the URL, and nothing is submitted."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import elastane
import s3_server as s3mod
from conftest import get_app, rest, running_cluster
from protocol.dataset_manifest import load_manifest
from protocol.ps_status import FINAL_STATUS_FILE, PsStatus, read_status
from psruntime.apps.dataset_files import write_generated
from psruntime.apps.registry import create_app
from user_app_source import file_linreg_source, write_linreg_data

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(s3mod.unavailable_reason() is not None,
                                 reason=f"no S3 server here: {s3mod.unavailable_reason()}")]

DATA = {"num_samples": 800, "num_heldout": 200, "rows_per_block": 100, "seed": 5}


def elastane_cli(rm_url: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                 timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: its own process, S3 settings from the environment (the test's)."""
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", "--rm", rm_url, "--user", "alice", *args],
                          capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)


def submit(rm_url: str, *args: str, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    """`elastane ps submit` (of mlr unless `args` name an --app); (its result, the app id)."""
    app = [] if "--app" in args else ["--app", "mlr"]
    r = elastane_cli(rm_url, "ps", "submit", *app, "--workers", "2", "--servers", "1",
                     "--executor-memory", "256", "--am-memory", "384", *args, env=env, cwd=cwd)
    first = r.stdout.splitlines()[0] if r.stdout else ""
    return r, first.split()[-1] if first.startswith("Submitted application ") else ""


def status_json(s3: s3mod.S3Bucket, app_id: str) -> PsStatus:
    """The AM's final status, in the app's durable dir under the RM's checkpoint_dir (in S3)."""
    return read_status(s3.filesystem().cat_file(f"{s3.bucket}/apps/{app_id}/{FINAL_STATUS_FILE}"))


@pytest.fixture(scope="module")
def s3_cluster(s3_server: s3mod.S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, s3mod.S3Bucket]]:
    """A localhost cluster whose RM keeps apps' checkpoints in S3 (rm.toml checkpoint_dir), its
    daemons given the server's endpoint and keys in their environment; and that bucket."""
    base = tmp_path_factory.mktemp("s3-cluster")
    bucket = s3mod.S3Bucket(s3_server, s3_server.create_bucket())
    rm_toml = base / "rm.toml"
    rm_toml.write_text(f'[rm]\ncheckpoint_dir = "{bucket.url("apps")}"\n')
    # A generous AM expiry: this is about storage, not liveness, and AMs start slowly on a busy machine.
    with running_cluster(base / "c", extra_rm_args=["--config", str(rm_toml)], env=s3_server.env,
                         am_expiry_s=30) as c:
        yield c, bucket


def test_a_ps_job_keeps_everything_in_s3_and_a_second_starts_from_its_model(s3_cluster, s3, tmp_path: Path) -> None:
    """(`s3`: the server's keys and endpoint in this process's environment, as the CLI and
    elastane.load_model read them.)"""
    c, bucket = s3_cluster
    fs = bucket.filesystem()
    ds = tmp_path / "ds"
    write_generated(create_app("mlr", DATA), str(ds))
    for p in sorted(ds.rglob("*")):
        if p.is_file():
            fs.put_file(str(p), f"{bucket.bucket}/datasets/mlr/{p.relative_to(ds).as_posix()}")
    # the first job trains on the dataset's data generated in place (the same dimensions and seed),
    # the second on the files in S3, starting from the first one's model
    dims = [f"data.{k}={v}" for k, v in {**load_manifest(str(ds)).spec, "seed": DATA["seed"]}.items()]
    generated = [a for d in dims for a in ("--set", d)]
    output = bucket.url("models", "m1")
    r, app_id = submit(c.rm_url, "--max-epochs", "3", *generated, "--set", f"output={output}",
                       "--set", "checkpoint_every_epochs=1", "--wait")
    assert r.returncode == 0 and app_id, r.stdout + r.stderr
    app = get_app(c.rm_url, app_id)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    # checkpoints and the AM's final status in the RM's checkpoint_dir, in S3
    final = status_json(bucket, app_id)
    assert [h.epoch for h in final.objective_history] == [0, 1, 2]
    ckpts = {k.split("/checkpoints/", 1)[1].split("/")[0] for k in fs.find(f"{bucket.bucket}/apps/{app_id}/checkpoints")}
    assert ckpts and all(fs.exists(f"{bucket.bucket}/apps/{app_id}/checkpoints/{d}/job.json") for d in ckpts), ckpts
    # the model output loads from S3 and scores what the job scored at its end
    model = elastane.load_model(output)
    assert model.metadata.epoch == 3 and model.metadata.job["output"] == output
    assert model.evaluate() == pytest.approx(final.final_metrics)

    # a second job reads its data from S3 and starts from the first one's model in S3
    r, warm_id = submit(c.rm_url, "--max-epochs", "1", "--set", f"data.path={bucket.url('datasets', 'mlr')}",
                        "--set", f"data.seed={DATA['seed']}", "--set", f"init_from={output}", "--wait")
    assert r.returncode == 0 and warm_id, r.stdout + r.stderr
    warm_app = get_app(c.rm_url, warm_id)
    assert warm_app["finalStatus"] == "SUCCEEDED", warm_app["diagnostics"]
    assert warm_app["elastane"]["ps-job"]["data"]["path"] == bucket.url("datasets", "mlr")
    warm = status_json(bucket, warm_id)
    # the same data (files written from the same generator): the saved model's objective, far below a cold start
    assert warm.initial_objective == pytest.approx(final.objective_history[-1].objective, rel=0.02)
    assert warm.initial_objective is not None and final.initial_objective is not None
    assert warm.initial_objective < final.initial_objective * 0.9


def test_files_staged_in_s3_reach_every_executor_and_bad_locations_are_refused(s3_cluster, s3, tmp_path: Path) -> None:
    c, bucket = s3_cluster
    (tmp_path / "s3app.py").write_text(file_linreg_source(max_epochs=2))
    write_linreg_data(tmp_path / "linreg.npz")
    ship = ["--app", "s3app:FileLinRegApp", "--py-files", str(tmp_path / "s3app.py"),
            "--files", str(tmp_path / "linreg.npz"), "--staging-dir", bucket.url("staging")]
    # the app's module and its data file exist only in S3's staging area: every container (the AM
    # and each executor) must localize both from there for the job to train
    r, app_id = submit(c.rm_url, *ship, "--wait", cwd=tmp_path)
    assert r.returncode == 0 and app_id, r.stdout + r.stderr
    app = get_app(c.rm_url, app_id)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    resources = app["elastane"]["ps-job"]["resources"]
    for name in ("s3app.py", "linreg.npz"):
        staged = bucket.url("staging", "alice", app_id, name)
        assert resources[name]["resource"] == staged
        assert bucket.filesystem().cat_file(staged.removeprefix("s3://")) == (tmp_path / name).read_bytes()

    before = len((rest(c.rm_url, "GET", "/ws/v1/cluster/apps").get("apps") or {}).get("app") or [])
    # a missing bucket is refused at submission, naming the field and the URL
    r, none = submit(c.rm_url, "--app", "mlr", "--max-epochs", "1", "--set", "output=s3://no-such-bucket/m2")
    assert r.returncode == 2 and not none, r.stdout + r.stderr
    assert "ps-job.output" in r.stderr and "s3://no-such-bucket/m2" in r.stderr and "Traceback" not in r.stderr
    # a client with wrong keys cannot stage its files: exit 2 naming the staging URL, nothing uploaded
    r, none = submit(c.rm_url, *ship, cwd=tmp_path, env={**os.environ, "AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert r.returncode == 2 and not none, r.stdout + r.stderr
    assert f"staging_dir: '{bucket.url('staging')}'" in r.stderr and "denied" in r.stderr and "Traceback" not in r.stderr
    after = len((rest(c.rm_url, "GET", "/ws/v1/cluster/apps").get("apps") or {}).get("app") or [])
    assert after == before
