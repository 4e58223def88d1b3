"""bench/host_suite.py --quick: the 16-core suite's smoke run on this machine (it times nothing).

What it checks is the suite's machinery: every part runs under the interpreter it is given (a
wrapper that notes its calls here), the testbed hosts' RM and NMs -- started over ssh by
bin/start-cluster -- run under it too (ELASTANE_PYTHON), at most 8 files come back, Harmony's
first, each written when its part is done, each with its part's result."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from elastane_cli import testbed_hosts

ROOT = Path(__file__).resolve().parents[2]
_reason = testbed_hosts.unavailable_reason(sshd=True)
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(_reason is not None, reason=f"no multi-host testbed here: {_reason}")]


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A dir the testbed hosts see too (each host mounts its own /tmp; the project is shared):
    under the project's ignored build/."""
    (ROOT / "build").mkdir(exist_ok=True)     # a fresh clone has no build/
    d = Path(tempfile.mkdtemp(prefix="host-suite-test-", dir=ROOT / "build"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout(2400)
def test_the_quick_suite_runs_every_part_under_the_given_interpreter(tmp_path: Path, outside_tmp: Path) -> None:
    calls = outside_tmp / "calls"
    py = outside_tmp / "python-wrapper"
    py.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    out = tmp_path / "out"
    r = subprocess.run([str(py), str(ROOT / "bench" / "host_suite.py"), "--quick", "--out", str(out),
                        "--python", str(py)], capture_output=True, text=True, timeout=2300)
    files = sorted(out.iterdir(), key=lambda f: f.stat().st_mtime_ns)
    assert len(files) <= 8
    assert [f.name for f in files][0] == "1-harmony-dop.json"          # Harmony's figure first
    suite = json.loads((out / "7-suite.json").read_text())
    assert [f.name for f in files] == suite["files"]                      # each written when its part was done
    assert suite["python"] == str(py)
    for f in files[:-1]:
        part = json.loads(f.read_text())
        assert part["ok"], (f.name, part.get("rc"), part.get("result"), part.get("stderr_tail", "")[-2000:])
        assert isinstance(part["result"], dict)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = calls.read_text().splitlines()
    # the parts, and the testbed's daemons on the master and on the node hosts (reached over ssh)
    assert any("bench/harmony_colocation.py" in x for x in lines)
    assert any(x.startswith("-m rm") for x in lines)
    assert sum(x.startswith("-m nodemanager") for x in lines) >= 2
    free = json.loads((out / "2-harmony-free.json").read_text())
    assert "jct_gain_vs_isolated_dop" in free["gains"]

