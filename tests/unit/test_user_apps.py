"""User apps named "module:Class": the job spec's validation of the name, the registry's loading
(errors name `app`), the CLI's shipping of --py-files and its check with the app's own types."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

from elastane_cli.errors import UsageError
from elastane_cli.staging import ShippedFiles, importable, split_list
from protocol import ps_job_spec
from protocol.ps_job_spec import JobSpecError
from psruntime.apps.base import AppConfigError
from psruntime.apps.registry import UserCodeError, create_app, create_job_app, get_app
from user_app_source import linreg_source


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working dir holding the user's module, as a container's would (modules imported from it
    are forgotten afterwards, so each test imports its own copy)."""
    (tmp_path / "mymodel.py").write_text(linreg_source())
    (tmp_path / "broken.py").write_text("import numpy\nraise RuntimeError('broken at import')\n")
    (tmp_path / "notanapp.py").write_text("class NotAnApp:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    with importable([]):
        yield tmp_path
    sys.path[:] = [p for p in sys.path if p != str(tmp_path)]


# ----- the job spec ------------------------------------------------------------------------------

@pytest.mark.parametrize("app, message", [
    ("svm", "app: unknown app 'svm'"),
    ("mymodel:", "app: 'mymodel:' is not \"module:Class\""),
    (":MyApp", "is not \"module:Class\""),
    ("my-model:MyApp", "is not \"module:Class\""),
    ("mymodel:My.App", "is not \"module:Class\""),
    ("pkg..mod:MyApp", "is not \"module:Class\""),
    ("mymodel:MyApp:x", "is not \"module:Class\""),
    ("1mod:MyApp", "is not \"module:Class\""),
])
def test_a_bad_app_name_is_refused_naming_app(app: str, message: str) -> None:
    with pytest.raises(JobSpecError) as e:
        ps_job_spec.validate({"app": app})
    assert e.value.field == "app"
    assert message in str(e.value)


def test_a_user_app_spec_is_checked_only_for_its_generic_fields() -> None:
    spec = ps_job_spec.validate({"app": "pkg.mymodel:MyApp", "data": {"anything": 1}, "hparams": {"lr": 2},
                                 "workers": 3})
    assert spec.is_user_app and spec.app_data() == {"anything": 1}
    with pytest.raises(JobSpecError, match=r"^max_workers: 1 is below workers"):
        ps_job_spec.validate({"app": "mymodel:MyApp", "workers": 2, "max_workers": 1})


def test_resources_are_validated_naming_the_entry() -> None:
    good = {"resource": "/shared/mymodel.py", "size": 10, "timestamp": 5}
    spec = ps_job_spec.validate({"app": "mymodel:MyApp", "resources": {"mymodel.py": good}})
    assert spec.resources["mymodel.py"].resource == "/shared/mymodel.py"
    with pytest.raises(JobSpecError, match=r"^resources\.a/b"):
        ps_job_spec.validate({"app": "mlr", "resources": {"a/b": good}})
    with pytest.raises(JobSpecError, match=r"^resources\.x\.type"):
        ps_job_spec.validate({"app": "mlr", "resources": {"x": {**good, "type": "JAR"}}})
    with pytest.raises(JobSpecError, match=r"^resources\.x\.resource: must not be empty"):
        ps_job_spec.validate({"app": "mlr", "resources": {"x": {"resource": ""}}})


# ----- loading ----------------------------------------------------------------------------------

def test_a_user_app_loads_from_the_working_dir_and_trains_a_step(user_dir: Path) -> None:
    assert str(user_dir) not in sys.path      # the loader puts the working dir there itself
    app = create_app("mymodel:LinRegApp", {"num_samples": 300}, {"learning_rate": 0.2})
    assert app.num_rows == 300 and app.num_blocks == 3 and app.hparams.learning_rate == 0.2
    assert os.getcwd() in sys.path
    spec = ps_job_spec.validate({"app": "mymodel:LinRegApp", "hparams": {"max_epochs": 2}, "max_epochs": 3})
    assert create_job_app(spec).hparams.max_epochs == 3     # the job-level override wins


@pytest.mark.parametrize("name, error, message", [
    ("nosuchmodule:App", AppConfigError, "app: no module 'nosuchmodule'"),
    ("mymodel:Missing", AppConfigError, "has no 'Missing'"),
    ("notanapp:NotAnApp", AppConfigError, "is not a subclass of elastane.app_api.PSApp"),
    ("mymodel:KeyValues", AppConfigError, "is not a subclass"),
    ("broken:App", UserCodeError, "RuntimeError: broken at import"),
])
def test_loading_errors_name_app(user_dir: Path, name: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as e:
        get_app(name)
    assert message in str(e.value)


def test_a_user_import_error_carries_its_traceback(user_dir: Path) -> None:
    with pytest.raises(UserCodeError) as e:
        get_app("broken:App")
    assert "Traceback" in str(e.value) and "broken.py" in str(e.value)


def test_a_user_apps_own_types_check_its_config(user_dir: Path) -> None:
    with pytest.raises(AppConfigError, match="learning_rate"):
        create_app("mymodel:LinRegApp", {}, {"learning_rate": -1})
    with pytest.raises(AppConfigError, match="bogus"):
        create_app("mymodel:LinRegApp", {"bogus": 1}, {})
    with pytest.raises(AppConfigError, match="preset: .* has no preset 'large'"):
        create_app("mymodel:LinRegApp", {}, {}, preset="large")


# ----- shipping ---------------------------------------------------------------------------------

def test_shipped_files_are_checked_per_flag(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\n")
    (tmp_path / "data.csv").write_text("1,2\n")
    (tmp_path / "x.tar.gz").write_bytes(b"")
    assert split_list(["a.py,b.py", " c.py "]) == ["a.py", "b.py", "c.py"]
    with pytest.raises(UsageError, match="--py-files: .*nope.py: no such file"):
        ShippedFiles.from_flags([str(tmp_path / "nope.py")], None, None)
    with pytest.raises(UsageError, match=r"--py-files: .*data.csv: not a Python module"):
        ShippedFiles.from_flags([str(tmp_path / "data.csv")], None, None)
    with pytest.raises(UsageError, match="--archives: .*m.py: not an archive"):
        ShippedFiles.from_flags(None, None, [str(tmp_path / "m.py")])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "m.py").write_text("x = 2\n")
    with pytest.raises(UsageError, match="a second file named 'm.py'"):
        ShippedFiles.from_flags([str(tmp_path / "m.py")], [str(tmp_path / "other" / "m.py")], None)


def test_staging_uploads_under_user_and_app_id_with_the_copys_size_and_mtime(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\n")
    (tmp_path / "x.tar.gz").write_bytes(b"\x1f\x8b")
    shipped = ShippedFiles.from_flags([str(tmp_path / "m.py")], None, [str(tmp_path / "x.tar.gz")])
    staging = tmp_path / "staging"
    res = shipped.stage(f"file://{staging}", "alice", "application_1_0001")
    copy = staging / "alice" / "application_1_0001" / "m.py"
    assert copy.read_text() == "x = 1\n"
    assert res["m.py"].resource == str(copy) and res["m.py"].type == "FILE"
    assert (res["m.py"].size, res["m.py"].timestamp) == (6, int(copy.stat().st_mtime * 1000))
    assert res["x.tar.gz"].type == "ARCHIVE"
    in_place = shipped.stage(None, "alice", "application_1_0001")      # no staging_dir
    assert in_place["m.py"].resource == str((tmp_path / "m.py").resolve())
    with pytest.raises(UsageError, match="staging_dir: .*not an absolute path"):
        shipped.stage("relative/dir", "alice", "application_1_0001")
