"""bench/host_suite.py without a testbed: its arguments and how it judges a part."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench_module import load_bench

ROOT = Path(__file__).resolve().parents[2]
hs = load_bench("host_suite")


def test_an_interpreter_the_hosts_cannot_see_is_refused(tmp_path: Path) -> None:
    py = tmp_path / "python"          # under /tmp: every testbed host mounts its own
    py.write_text("#!/bin/sh\nexit 0\n")
    py.chmod(0o755)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "host_suite.py"), "--out", str(tmp_path / "o"),
                        "--python", str(py)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "under /tmp" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "host_suite.py"), "--out", str(tmp_path / "o"),
                        "--parts", "harmony-dop,nope"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "nope" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_part_is_ok_only_with_a_result_and_every_mode_run() -> None:
    assert hs.part_ok(0, {"launch_p50_ms": 3.0})
    assert not hs.part_ok(1, {"launch_p50_ms": 3.0})
    assert not hs.part_ok(0, None)
    assert not hs.part_ok(0, {"error": "testbed unavailable"})
    # harmony_colocation reports a failed run inside its mode, with exit 0
    assert hs.part_ok(0, {"isolated": {"ok_runs": 1}, "harmony": {"ok_runs": 1}, "jct_gain": 1.2})
    assert not hs.part_ok(0, {"isolated": {"ok_runs": 1}, "harmony": {"ok_runs": 0}, "jct_gain": None})


def test_at_most_eight_files_harmony_first() -> None:
    files = [p.file for p in hs.PARTS] + [hs.SUITE_FILE]
    assert len(files) <= 8 and len(set(files)) == len(files)
    assert files[0].startswith("1-harmony") and files == sorted(files)
    assert abs(sum(p.share for p in hs.PARTS) - 1.0) < 1e-9
    assert hs.last_json("noise\n{\"a\": 1}\n") == {"a": 1} and hs.last_json("no json") is None


def test_every_part_is_a_bench_and_the_scaling_part_passes_its_checks() -> None:
    assert all((ROOT / "bench" / p.script).is_file() for p in hs.PARTS)
    sc = load_bench("scaling")
    part = next(p for p in hs.PARTS if p.name == "ps-scaling")
    full = sc.parse_args(list(part.args))          # exits 2 (SystemExit) on an option it refuses
    assert full.host_list == [1, 2, 4, 8] and full.app_list == ["mlr"] and full.rows == {"mlr": 48_000}
    quick = sc.parse_args(list(part.quick_args))
    assert quick.host_list == [1, 2] and quick.preset == "tiny" and quick.repeats == 1
