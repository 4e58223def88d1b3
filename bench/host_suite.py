"""The 16-core suite: one prepared command for a short, one-shot lease of a bigger offline host.

    python3 bench/host_suite.py --out DIR [--python PY] [--budget-s 480] [--quick] [--parts a,b]

On a 16-core host (issue 33 part 6), within `--budget-s` (default 480 s: the lease's 8 minutes of
run time), it runs these parts one after another, each a subprocess with its own timeout, and
writes each part's file into `--out` as soon as that part is done (Harmony first):

1. `1-harmony-dop.json`: bench/harmony_colocation.py on 4 testbed hosts of 4 cores (0.75 of a
   2-core machine's in `--quick`), isolated against Harmony, every job at the same DoP
   (`--harmony-nodes dop`);
2. `2-harmony-free.json`: the same hosts and jobs, Harmony choosing each group's nodes
   (`--harmony-nodes free`), with isolated at DoP 2 from part 1 as its baseline (same run, same
   hosts, same jobs);
3. `3-ps-scaling.json`: bench/scaling.py, one MLR job on 1 / 2 / 4 / 8 hosts of 1.5 cores each
   against one numpy process in one host's budget;
4. `4-cruise.json`: bench/cruise_vs_grid.py at 12 executors (Cruise against the grid of splits);
5. `5-container-launch.json`: bench/container_launch.py (launch latency against fork+exec);
6. `6-dataplane.json`: bench/dataplane.py (push+pull against the raw-socket ceiling);
7. `7-suite.json`: the interpreter, the machine, each part's status, wall time and timeout.

At most 8 files, each small (a part's last-line JSON and the tail of its stderr), so they all come
back from a lease that returns 8. A part that fails or runs out of time still writes its file
(`ok: false`, why, the stderr tail); the suite goes on with the next while time is left (each
part's timeout is its share of the budget, cut to what is left) and exits 1 if any part failed.

The interpreter: the host's image has Python 3.12 without msgspec, orjson or lz4; cp312 wheels of
what it lacks travel with the checkout (`.offline/`, made by the offline-host preparation script:
it downloads them pinned to the project's `.venv` and writes `.offline/setup.sh`, which installs
them and the project into the image's Python). Run

    source .offline/setup.sh && python3 bench/host_suite.py --out "$OUT"

`--python` (default: `$ELASTANE_PYTHON`, else this interpreter) runs every part, and the suite
sets `ELASTANE_PYTHON` to it for them: bin/elastane-daemon and bin/start-rm run the testbed hosts'
RM and NMs with it and bin/start-cluster carries it over ssh (an ssh session's PATH is sshd's, and
a `.venv` symlinked to the image's Python failed there), so the NMs' containers -- AMs, executors
-- run it too (the NM puts its own interpreter's bin/ first on their PATH).

`--quick` is the smoke run of the test suite (tests/cluster/test_host_suite.py) on a 2-core
machine: every part at its smallest (2 hosts of 0.3 core, 2 jobs of 1 epoch; tiny MLR on 1 and 2
hosts of 0.3 core; a grid-only Cruise at 2 executors; 5 containers; 1 round of 0.2 s) -- it checks
the suite's machinery, it times nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
MAX_FILES = 8
STDERR_TAIL = 4000       # characters of a part's stderr kept in its file
KILL_GRACE_S = 20.0      # after SIGTERM (the benches stop their clusters on it), then SIGKILL


@dataclass(frozen=True)
class Part:
    """One figure of the suite: its file, its bench and arguments, its share of the budget."""

    name: str
    file: str
    script: str
    args: tuple[str, ...]
    quick_args: tuple[str, ...]
    share: float             # of the budget


# Sized for the lease, not for a paper figure: 8 jobs of 4 epochs, one run per mode (a part cut
# short by its timeout still leaves each finished mode's figures in its file's stderr tail).
HARMONY_HOSTS = ("--hosts", "4", "--host-cpus", "4", "--jobs", "8", "--epochs", "4", "--repeats", "1", "--dop", "2")
HARMONY_QUICK = ("--hosts", "2", "--host-cpus", "0.3", "--jobs", "2", "--epochs", "1", "--repeats", "1", "--dop", "1",
                 "--timeout-s", "600")
PARTS: tuple[Part, ...] = (
    Part("harmony-dop", "1-harmony-dop.json", "harmony_colocation.py",
         (*HARMONY_HOSTS, "--modes", "isolated,harmony", "--harmony-nodes", "dop"),
         (*HARMONY_QUICK, "--modes", "isolated,harmony", "--harmony-nodes", "dop"), 0.32),
    Part("harmony-free", "2-harmony-free.json", "harmony_colocation.py",
         (*HARMONY_HOSTS, "--modes", "harmony", "--harmony-nodes", "free"),
         (*HARMONY_QUICK, "--modes", "harmony", "--harmony-nodes", "free"), 0.18),
    # 1.5 cores a host: 0.75 of 16 cores over 8 hosts, the rest for the master (RM, AMs) and the
    # kernel; 48,000 rows of the small preset are 24 blocks of 2,000, the same share for every host
    # at 1, 2, 4 and 8.
    Part("ps-scaling", "3-ps-scaling.json", "scaling.py",
         ("--apps", "mlr", "--hosts", "1,2,4,8", "--host-cpus", "1.5", "--preset", "small", "--samples", "48000",
          "--epochs", "3", "--repeats", "1", "--sync-batches", "32"),
         ("--quick", "--apps", "mlr", "--hosts", "1,2"), 0.20),
    Part("cruise", "4-cruise.json", "cruise_vs_grid.py", ("--executors", "12", "--workloads", "mlr-b50,nmf-b20"),
         ("--executors", "2", "--workloads", "mlr-b50", "--grid-only"), 0.15),
    Part("container-launch", "5-container-launch.json", "container_launch.py",
         ("--containers", "60", "--serial", "10", "--nodes", "2"), ("--containers", "5", "--serial", "2"), 0.08),
    Part("dataplane", "6-dataplane.json", "dataplane.py", ("--seconds", "1.0", "--rounds", "3"),
         ("--seconds", "0.2", "--rounds", "1"), 0.07),
)
SUITE_FILE = "7-suite.json"
assert len(PARTS) + 1 <= MAX_FILES


def last_json(text: str) -> Optional[dict[str, Any]]:
    """The last line of `text` that is a JSON object (a bench's result), or None."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            return value if isinstance(value, dict) else None
    return None


def run_part(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str, str, bool]:
    """(exit code, stdout, stderr, timed out) of one part; on its timeout SIGTERM to its process
    group (the benches stop their clusters on it), SIGKILL after a grace."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout_s))
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return proc.returncode, out, err, True


def part_ok(rc: int, result: Optional[dict[str, Any]]) -> bool:
    """A part succeeded: it exited 0 with a result that reports no error, and (Harmony) every mode
    it ran finished at least one run (harmony_colocation reports a failed run inside its mode)."""
    if rc != 0 or result is None or "error" in result:
        return False
    modes = [v for v in result.values() if isinstance(v, dict) and "ok_runs" in v]
    return all(int(v["ok_runs"]) > 0 for v in modes)


def write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    tmp.replace(path)        # the file appears whole


def harmony_free_gains(free: dict[str, Any], dop: Optional[dict[str, Any]]) -> dict[str, Any]:
    """Harmony with free DoP against part 1's isolated run (same hosts and jobs, same suite run)."""
    iso = ((dop or {}).get("result") or {}).get("isolated") or {}
    har = (free.get("result") or {}).get("harmony") or {}

    def ratio(a: Any, b: Any) -> Optional[float]:
        return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
    return {"jct_gain_vs_isolated_dop": ratio(iso.get("mean_jct_s"), har.get("mean_jct_s")),
            "makespan_gain_vs_isolated_dop": ratio(iso.get("makespan_s"), har.get("makespan_s")),
            "baseline": "part 1's isolated mode (every job at --dop, hosts of its own)"}


def run_suite(out_dir: Path, python: str, budget_s: float, quick: bool, names: list[str],
              log: Callable[[str], None]) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ELASTANE_PYTHON": python, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    deadline = start + budget_s
    parts = [p for p in PARTS if p.name in names]
    total_share = sum(p.share for p in parts) or 1.0
    status: dict[str, Any] = {}
    results: dict[str, dict[str, Any]] = {}
    for i, part in enumerate(parts):
        left = deadline - time.monotonic()
        # its share of the budget, and whatever earlier parts left unused, but never past the deadline
        # (less a grace for the next parts' files)
        share = budget_s * part.share / total_share
        later = sum(budget_s * p.share / total_share for p in parts[i + 1:])
        timeout = min(left - KILL_GRACE_S, max(share, left - later))
        if timeout < 10.0:
            record = {"part": part.name, "ok": False, "skipped": f"no time left ({left:.0f} s)"}
        else:
            cmd = [python, str(ROOT / "bench" / part.script), *(part.quick_args if quick else part.args)]
            log(f"{part.name}: {' '.join(cmd[1:])} (timeout {timeout:.0f} s)")
            t0 = time.monotonic()
            rc, out, err, timed_out = run_part(cmd, env, timeout)
            result = last_json(out)
            record = {"part": part.name, "ok": part_ok(rc, result),
                      "rc": rc, "timed_out": timed_out, "wall_s": round(time.monotonic() - t0, 1),
                      "timeout_s": round(timeout, 1), "command": cmd[1:], "result": result,
                      "stderr_tail": err[-STDERR_TAIL:]}
            if part.name == "harmony-free":
                record["gains"] = harmony_free_gains(record, results.get("harmony-dop"))
        results[part.name] = record
        write_json(out_dir / part.file, record)
        status[part.name] = {k: record.get(k) for k in ("ok", "rc", "timed_out", "wall_s", "timeout_s", "skipped")}
        log(f"{part.name}: {'ok' if record['ok'] else 'FAILED'} -> {part.file}")
    summary = {"python": python, "python_version": platform.python_version(), "cores": os.cpu_count(),
               "machine": platform.node(), "quick": quick, "budget_s": budget_s,
               "wall_s": round(time.monotonic() - start, 1), "parts": status,
               "files": [p.file for p in parts] + [SUITE_FILE], "ok": all(s["ok"] for s in status.values())}
    write_json(out_dir / SUITE_FILE, summary)
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the (at most 8) result files")
    p.add_argument("--python", default=None,
                   help="interpreter for every part and the testbed's daemons (default: $ELASTANE_PYTHON, else this one)")
    p.add_argument("--budget-s", type=float, default=None, help="run time for all parts (default 480; --quick 1800)")
    p.add_argument("--parts", default=",".join(x.name for x in PARTS), help="comma-separated subset, in suite order")
    p.add_argument("--quick", action="store_true", help="smoke run on a small machine (times nothing)")
    ns = p.parse_args(argv)
    python = ns.python or os.environ.get("ELASTANE_PYTHON") or sys.executable
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        p.error(f"--python / ELASTANE_PYTHON: {python!r} is not an executable file")
    where = Path(python).resolve()
    if where.is_relative_to("/tmp") and not where.is_relative_to(ROOT):
        # every testbed host mounts its own /tmp (docs/testbed.md) and sees of the machine's only the
        # shared paths, the project among them (a clone under /tmp, as CI's may be): elsewhere there
        # the hosts would not find it
        p.error(f"--python / ELASTANE_PYTHON: {python!r} is under /tmp, which each testbed host has its own of")
    names = [x for x in ns.parts.split(",") if x]
    unknown = sorted(set(names) - {x.name for x in PARTS})
    if not names or unknown:
        p.error(f"--parts: unknown {', '.join(unknown) or '(none given)'}; parts: {', '.join(x.name for x in PARTS)}")
    budget = ns.budget_s if ns.budget_s is not None else (1800.0 if ns.quick else 480.0)
    if budget <= 0:
        p.error(f"--budget-s must be > 0, got {budget}")
    if ns.out.exists() and not ns.out.is_dir():
        p.error(f"--out {ns.out} is not a directory")

    def log(text: str) -> None:
        print(f"[host_suite] {text}", file=sys.stderr, flush=True)
    summary = run_suite(ns.out, python, budget, ns.quick, names, log)
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
