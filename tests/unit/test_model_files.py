"""Models that travel, without a cluster: the AM's model output keeps the job's shipped files (a
user app's module and the data file it opens by a relative name) -- copied, or referenced by URL
with size and timestamp -- so `elastane model evaluate | predict` scores the model from any
directory once the job's working dir and staged files are gone; `--data` reaches a user app's own
reader; whatever cannot be read exits 2 naming it, never with a traceback."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import elastane
from appmaster.ps.model_output import ModelOutput, job_files
from protocol import ps_job_spec
from protocol.durable_storage import DurableDir
from protocol.local_resources import LocalResource
from psruntime.apps.registry import create_job_app
from psruntime.store.model_files import write_model
from user_app_source import file_linreg_source, linreg_source, write_linreg_data

REPO = Path(__file__).resolve().parents[2]


def stage(tmp: Path, module: str, source: str, data: bool = True) -> dict[str, Any]:
    """The job's files as `ps submit` stages them (absolute paths with size and mtime)."""
    staged = tmp / "staging"
    staged.mkdir(exist_ok=True)
    (staged / f"{module}.py").write_text(source)
    if data:
        write_linreg_data(staged / "linreg.npz")
    out = {}
    for p in staged.iterdir():
        st = p.stat()
        out[p.name] = {"resource": str(p), "type": "FILE", "size": st.st_size, "timestamp": st.st_mtime_ns // 10**6}
    return out


def train_like_the_am(tmp: Path, module: str, source: str, copy_max_bytes: int | None = None,
                      data: bool = True) -> tuple[Path, np.ndarray, dict[str, float]]:
    """Write a model as the AM does, from an AM working dir whose resources link to the staged
    files; returns (output, values, the app's held-out metrics of them there)."""
    resources = stage(tmp, module, source, data)
    spec = ps_job_spec.validate({"app": f"{module}:FileLinRegApp" if "FileLinRegApp" in source else f"{module}:LinRegApp",
                                 "resources": resources, "output": str(tmp / "model")})
    work = tmp / "am-work"
    work.mkdir()
    for name, res in spec.resources.items():
        (work / name).symlink_to(res.resource)
    if not data:
        write_linreg_data(work / "linreg.npz")
    before, sys_path = os.getcwd(), list(sys.path)
    os.chdir(work)
    sys.path.insert(0, str(work))
    try:
        app = create_job_app(spec)
        values = np.random.default_rng(3).normal(size=(app.num_keys, app.key_length)).astype(np.float32)
        metrics = app.evaluate(values, app.generate_heldout())
        out = ModelOutput(spec, app, "appattempt_1_0001_000001")
        if copy_max_bytes is not None:
            out.files = job_files(spec.resources, work, copy_max_bytes)
        meta = out.metadata("final", 3, [3.0, 2.0, 1.0], 4.0, metrics, 3, [])
        target = DurableDir(spec.output).child("final")
        target.makedirs()
        out.put_files(target, meta)
        write_model(target, values, meta)
    finally:
        os.chdir(before)
        sys.path[:] = sys_path
        sys.modules.pop(module, None)
    for p in work.iterdir():     # the job's working dir is gone with its containers
        p.unlink()
    work.rmdir()
    return tmp / "model", values, metrics


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, in another directory (a fresh process: nothing imported)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "elastane_cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d


def test_a_user_apps_shipped_data_file_travels_with_the_model(tmp_path: Path, elsewhere: Path) -> None:
    output, values, metrics = train_like_the_am(tmp_path, "filemodel", file_linreg_source())
    assert sorted(p.name for p in (output / "final" / "files").iterdir()) == ["filemodel.py", "linreg.npz"]
    for p in (tmp_path / "staging").iterdir():      # the staged copies are cleaned up too
        p.unlink()
    r = cli("model", "evaluate", str(output), "--json", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == pytest.approx(metrics)
    r = cli("model", "predict", str(output), "--out", str(elsewhere / "p.npy"), cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert np.load(elsewhere / "p.npy").shape == (200,)
    r = cli("model", "show", str(output), cwd=elsewhere)
    assert r.returncode == 0 and "linreg.npz (copied" in r.stdout, r.stdout + r.stderr
    # The library from another directory: the same, and the caller's working dir is left as it was
    code = ("import elastane, json, os, sys; m = elastane.load_model(sys.argv[1]); "
            "print(json.dumps([m.evaluate(), os.getcwd()]))")
    r = subprocess.run([sys.executable, "-c", code, str(output)], capture_output=True, text=True, timeout=120,
                       cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    got, cwd = json.loads(r.stdout)
    assert got == pytest.approx(metrics) and cwd == str(elsewhere)


def test_a_big_file_is_referenced_by_url_size_and_timestamp(tmp_path: Path, elsewhere: Path) -> None:
    output, _, metrics = train_like_the_am(tmp_path, "refmodel", file_linreg_source(), copy_max_bytes=4096)
    meta = elastane.load_model(output).metadata
    data = next(f for f in meta.files if f.name == "linreg.npz")
    staged = tmp_path / "staging" / "linreg.npz"
    assert (data.copied, data.resource, data.size) == (False, str(staged), staged.stat().st_size)
    assert data.timestamp == staged.stat().st_mtime_ns // 10**6
    assert not (output / "final" / "files" / "linreg.npz").exists()
    r = cli("model", "evaluate", str(output), "--json", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    # The referenced file changed since: refused naming it, exit 2, no traceback
    write_linreg_data(staged, rows=50)
    r = cli("model", "evaluate", str(output), cwd=elsewhere)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "'linreg.npz'" in r.stderr and str(staged) in r.stderr and "changed" in r.stderr
    staged.unlink()
    r = cli("model", "predict", str(output), cwd=elsewhere)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "'linreg.npz'" in r.stderr, r.stderr


def test_data_reaches_a_user_apps_own_reader(tmp_path: Path, elsewhere: Path) -> None:
    output, values, _ = train_like_the_am(tmp_path, "datamodel", file_linreg_source())
    other = elsewhere / "other.npz"
    write_linreg_data(other, rows=10, heldout=77, seed=5)
    r = cli("model", "predict", str(output), "--data", "other.npz", "--out", "p.npy", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    with np.load(other) as z:
        expected = z["x_heldout"] @ values[:, 0]
    assert np.allclose(np.load(elsewhere / "p.npy"), expected, atol=1e-5)
    r = cli("model", "evaluate", str(output), "--data", "missing.npz", cwd=elsewhere)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"--data: {elsewhere / 'missing.npz'}: " in r.stderr and "FileNotFoundError" in r.stderr


def test_missing_inputs_exit_2_naming_them(tmp_path: Path, elsewhere: Path) -> None:
    output, _, _ = train_like_the_am(tmp_path, "gonemodel", file_linreg_source())
    (output / "final" / "files" / "linreg.npz").unlink()
    r = cli("model", "evaluate", str(output), cwd=elsewhere)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "the job's file 'linreg.npz' is not in the model" in r.stderr
    # A job whose app read a file that was not shipped with it (it was in the AM's dir by other
    # means): the model cannot carry it; the app's own error names it, exit 2
    (tmp_path / "b").mkdir()
    output, _, _ = train_like_the_am(tmp_path / "b", "unshipped", file_linreg_source(), data=False)
    r = cli("model", "evaluate", str(output), cwd=elsewhere)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "FileNotFoundError" in r.stderr and "linreg.npz" in r.stderr
    # The app without a DATA_PATH_FIELD cannot take --data: said so
    (tmp_path / "c").mkdir()
    plain = tmp_path / "c"
    resources = stage(plain, "plainmodel", linreg_source(), data=False)
    spec = ps_job_spec.validate({"app": "plainmodel:LinRegApp", "resources": resources, "output": str(plain / "m")})
    work = plain / "w"
    work.mkdir()
    (work / "plainmodel.py").symlink_to(resources["plainmodel.py"]["resource"])
    sys.path.insert(0, str(work))
    try:
        app = create_job_app(spec)
        out = ModelOutput(spec, app, "a", work_dir=work)
        target = DurableDir(spec.output).child("final")
        target.makedirs()
        meta = out.metadata("final", 1, [1.0], 2.0, {}, None, [])
        out.put_files(target, meta)
        write_model(target, np.zeros((app.num_keys, 1), np.float32), meta)
    finally:
        sys.path.remove(str(work))
        sys.modules.pop("plainmodel", None)
    r = cli("model", "evaluate", str(plain / "m"), "--data", "x.npz", cwd=elsewhere)
    assert r.returncode == 2 and "DATA_PATH_FIELD" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_job_files_copy_small_files_and_reference_archives(tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "a.py").write_text("x = 1\n")
    (work / "env").mkdir()
    src = tmp_path / "env.tgz"
    src.write_bytes(b"not really an archive")
    resources = {"a.py": LocalResource(resource=str(tmp_path / "a.py")),
                 "env": LocalResource(resource=str(src), type="ARCHIVE")}
    files = {f.name: f for f in job_files(resources, work)}
    assert files["a.py"].copied and files["a.py"].size == 6
    env = files["env"]
    assert (env.copied, env.type, env.resource, env.size) == (False, "ARCHIVE", str(src), src.stat().st_size)
    assert env.timestamp == src.stat().st_mtime_ns // 10**6


def test_a_model_in_an_object_store_brings_its_files_to_a_temporary_dir(tmp_path: Path) -> None:
    """A model output on another host's storage (an fsspec URL; memory:// here): its copied files
    are fetched into a local dir the app's code runs in, and the caller's working dir is kept."""
    local, values, metrics = train_like_the_am(tmp_path, "remotemodel", file_linreg_source())
    url = f"memory://h1-models/{tmp_path.name}"
    remote = DurableDir(url).child("final")
    remote.makedirs()
    remote.child("files").makedirs()
    remote.child("files").put_files(sorted((local / "final" / "files").iterdir()))
    for name in ("model.npz", "metadata.json"):          # metadata.json last, as the AM writes it
        remote.write_bytes(name, (local / "final" / name).read_bytes())
    for p in (tmp_path / "staging").iterdir():
        p.unlink()
    cwd = os.getcwd()
    try:
        model = elastane.load_model(url)
        assert model.files_dir is not None and model.files_dir.is_relative_to(Path(tempfile.gettempdir()))
        assert sorted(p.name for p in model.files_dir.iterdir()) == ["linreg.npz", "remotemodel.py"]
        assert model.evaluate() == pytest.approx(metrics) and os.getcwd() == cwd
        assert np.array_equal(model.values, values)
    finally:
        sys.modules.pop("remotemodel", None)


def test_an_archive_is_referenced_and_unpacked_where_the_model_is_used(tmp_path: Path, elsewhere: Path) -> None:
    """`--archives data.tgz`: the model references the archive (URL, size, timestamp); reading the
    model unpacks it under its link name, so the app's `dataarc/linreg.npz` opens as on the cluster."""
    import tarfile

    staged = tmp_path / "staging"
    staged.mkdir()
    (staged / "arcmodel.py").write_text(file_linreg_source())
    write_linreg_data(tmp_path / "linreg.npz")
    with tarfile.open(staged / "dataarc.tgz", "w:gz") as tf:
        tf.add(tmp_path / "linreg.npz", arcname="linreg.npz")
    resources: dict[str, Any] = {}
    for name, kind in (("arcmodel.py", "FILE"), ("dataarc.tgz", "ARCHIVE")):
        st = (staged / name).stat()
        resources[name.removesuffix(".tgz")] = {"resource": str(staged / name), "type": kind, "size": st.st_size,
                                                "timestamp": st.st_mtime_ns // 10**6}
    spec = ps_job_spec.validate({"app": "arcmodel:FileLinRegApp", "data": {"data_file": "dataarc/linreg.npz"},
                                 "resources": resources, "output": str(tmp_path / "model")})
    work = tmp_path / "am-work"          # as the NM leaves it: the module linked, the archive unpacked
    (work / "dataarc").mkdir(parents=True)
    (work / "arcmodel.py").symlink_to(staged / "arcmodel.py")
    (work / "dataarc" / "linreg.npz").write_bytes((tmp_path / "linreg.npz").read_bytes())
    before = os.getcwd()
    os.chdir(work)
    sys.path.insert(0, str(work))
    try:
        app = create_job_app(spec)
        values = np.ones((app.num_keys, 1), np.float32)
        metrics = app.evaluate(values, app.generate_heldout())
        out = ModelOutput(spec, app, "a", work_dir=work)
        meta = out.metadata("final", 1, [1.0], 2.0, metrics, 1, [])
        target = DurableDir(spec.output).child("final")
        target.makedirs()
        out.put_files(target, meta)
        write_model(target, values, meta)
    finally:
        os.chdir(before)
        sys.path.remove(str(work))
        sys.modules.pop("arcmodel", None)
    shutil.rmtree(work)
    (tmp_path / "linreg.npz").unlink()
    arc = next(f for f in meta.files if f.name == "dataarc")
    assert (arc.copied, arc.type, arc.resource) == (False, "ARCHIVE", str(staged / "dataarc.tgz"))
    assert sorted(p.name for p in (tmp_path / "model" / "final" / "files").iterdir()) == ["arcmodel.py"]
    r = cli("model", "evaluate", str(tmp_path / "model"), "--json", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == pytest.approx(metrics)
