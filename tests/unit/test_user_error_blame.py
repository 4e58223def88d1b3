"""A user app's job fails "in user code" only when the user's code raised: an exception whose
traceback passes through the app's package. The runtime's own failures in such a job (an
unreadable init_from or durable dir) are named as the runtime's, and the user's code raising in
the AM (an objective combination) as the user's."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from appmaster.ps.user_errors import raised_in_user_code, user_failure
from protocol.model_output import ModelOutputError

APP = "blame_pkg.apps:MyApp"


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    pkg = tmp_path / "blame_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "apps.py").write_text("def combine(parts):\n    return sum(parts) / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import blame_pkg.apps as apps
    yield apps
    for name in [m for m in sys.modules if m == "blame_pkg" or m.startswith("blame_pkg.")]:
        del sys.modules[name]


def test_the_users_code_raising_in_the_am_is_blamed_on_it(user_package: types.ModuleType) -> None:
    spec = types.SimpleNamespace(app=APP)
    with pytest.raises(ZeroDivisionError) as info:
        user_package.combine([1.0, 2.0])
    assert raised_in_user_code(APP, info.value)
    msg = user_failure(spec, info.value)       # type: ignore[arg-type]
    assert msg is not None and msg.startswith("user code failed in the AM") and "blame_pkg/apps.py" in msg


def test_the_runtimes_failures_in_a_user_apps_job_are_not(user_package: types.ModuleType) -> None:
    spec = types.SimpleNamespace(app=APP)

    def read_init_from() -> None:
        raise ModelOutputError("init_from: s3://models/run1/final: no metadata.json")
    for fail in (read_init_from, lambda: open("/nonexistent/elastane/am-dir/job.json")):
        with pytest.raises(Exception) as info:
            fail()
        assert user_failure(spec, info.value) is None      # type: ignore[arg-type]
