"""Two commits' benchmark figures, interleaved on one machine: is the new one no slower?

    .venv/bin/python bench/ab_compare.py OLD NEW [--repeats 3] [--only eps,recovery,...] [--quick]

Each of OLD and NEW (commits, branches or tags) is checked out as a detached git worktree in a
temporary dir (sharing this checkout's .venv) and its own benchmark scripts are run there, with
PYTHONPATH set to that tree, so each side measures its own code with the benchmark of its time.
The runs alternate (OLD NEW, NEW OLD, OLD NEW, ...: the sides take turns at going first), so
a drift of the machine's speed during the comparison falls on both.

The figures (`FIGURES`) are those issue 35 names for "no slower": EPS add (`eps_add_s`,
bench/eps_overhead.py), a lost AM (`am_lost_s`, bench/recovery.py), the data plane at 8 MiB
(`ratio_8mib`, bench/dataplane.py, a ratio to raise) and the epoch time of a 2-worker MLR job
(`mlr_epoch_s_2x1`, bench/training.py). For each: every run's figure, the median and min-max per
side, and new median / old median (for a ratio to raise: old / new, so above 1 is always worse);
`within_1_1x` says whether that is at most 1.1.

Quiet: before every run the machine's busy share (elastane_cli.machine_load: the share of all cores
busy, from /proc/stat) is measured over `QUIET_WINDOW_S` while nothing of the comparison runs --
other work shows there at once, where the 1-minute load average still carries the previous
benchmark's own processes. The run waits up to `--quiet-wait` seconds for the share to fall to
`--max-busy` (default 0.15); a run that starts above it is marked saturated, kept in the output
and left out of the medians. The 1-minute load average is recorded too. A run that failed (exited
non-zero, timed out, gave no figure, or its last line has an `error`) is counted apart and its
value, if any, left out too. `within_1_1x` is null unless each side has at least 2 (`MIN_RUNS`)
quiet successful runs; the medians are given from one.

Last line, JSON: {"old", "new", "repeats", "saturated_runs", "failed_runs", "<figure>": {"old_median",
"new_median", "old_range", "new_range", "new_over_old", "within_1_1x", "old_quiet_runs",
"new_quiet_runs", "old_failed_runs", "new_failed_runs", "old_saturated_runs", "new_saturated_runs"},
...}.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from elastane_cli.machine_load import MachineMeter  # noqa: E402  (this checkout's, whichever side runs)

QUIET_WINDOW_S = 3.0
MIN_RUNS = 2            # quiet successful runs a side needs for a verdict


@dataclass(frozen=True)
class Figure:
    """One figure: which bench, its arguments, the key of its last-line JSON, and its direction."""

    name: str
    script: str
    args: tuple[str, ...]
    key: str
    higher_is_better: bool = False
    quick_args: tuple[str, ...] = ()


FIGURES = (
    Figure("eps", "bench/eps_overhead.py", ("--rounds", "3"), "eps_add_s",
           quick_args=("--features", "20000", "--classes", "16", "--samples", "600", "--executor-mb", "320",
                       "--rounds", "1")),
    Figure("recovery", "bench/recovery.py", (), "am_lost_s", quick_args=("--quick",)),
    Figure("dataplane", "bench/dataplane.py", (), "ratio_8mib", higher_is_better=True,
           quick_args=("--seconds", "0.5", "--rounds", "2")),
    Figure("mlr_epoch", "bench/training.py", ("--quality-presets", "none", "--no-ctr"), "mlr_epoch_s_2x1",
           quick_args=("--quick", "--quality-presets", "none", "--no-ctr")),
)


@dataclass
class Run:
    """One benchmark run of one side."""

    side: str
    figure: str
    value: Optional[float]
    busy_before: float
    load_before: float
    seconds: float
    saturated: bool
    error: str = ""
    report: dict[str, object] = field(default_factory=dict)     # the bench's whole last-line JSON


@dataclass
class Side:
    """A commit checked out for measuring."""

    name: str
    rev: str
    tree: Path
    runs: list[Run] = field(default_factory=list)


def checkout(rev: str, into: Path, side: str) -> Path:
    """A detached worktree of `rev` under `into` (named by `side`: both sides may be one rev),
    sharing this checkout's .venv."""
    tree = into / f"{side}-{rev.replace('/', '_')}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), rev],
                   check=True, capture_output=True, text=True)
    venv = ROOT / ".venv"
    if venv.exists() and not (tree / ".venv").exists():
        (tree / ".venv").symlink_to(venv)
    return tree


def imports_from(tree: Path) -> Path:
    """Where a process with the side's environment imports the project from (it must be the
    side's own tree: an editable install of another checkout would otherwise win)."""
    out = subprocess.run([sys.executable, "-c", "import appmaster; print(appmaster.__file__)"], cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()).resolve().parent.parent


def remove(tree: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    shutil.rmtree(tree, ignore_errors=True)


def last_json(text: str) -> dict[str, object]:
    """The benchmark's last-line JSON object ({} if its last line is none)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                out = json.loads(line)
            except json.JSONDecodeError:
                return {}
            return out if isinstance(out, dict) else {}
        if line:
            return {}
    return {}


def busy_share(window_s: float) -> float:
    """The share of all the machine's cores busy over the next `window_s` seconds."""
    meter = MachineMeter().start()
    time.sleep(window_s)        # a measurement window, not a wait for readiness
    return meter.stop().busy_share


def quiet_share(max_busy: float, wait_s: float) -> float:
    """The busy share once it is at most `max_busy`, or the last one after `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        share = busy_share(QUIET_WINDOW_S)
        if share <= max_busy or time.monotonic() >= deadline:
            return share


def run_once(side: Side, fig: Figure, quick: bool, max_busy: float, quiet_wait_s: float,
             timeout_s: float) -> Run:
    busy = quiet_share(max_busy, quiet_wait_s)
    load = os.getloadavg()[0]
    env = {**os.environ, "PYTHONPATH": str(side.tree)}
    args = fig.quick_args if quick else fig.args
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, fig.script, *args], cwd=side.tree, env=env, capture_output=True,
                           text=True, timeout=timeout_s)
        out, err = p.stdout, "" if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        out, err = "", f"did not finish within {timeout_s:.0f} s"
    report = last_json(out)
    value = report.get(fig.key)
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None and not err:
        err = f"no {fig.key!r} in the last line"
    return Run(side.name, fig.name, number, round(busy, 3), round(load, 2), round(time.monotonic() - t0, 1),
               busy > max_busy, err, report)


def failed(r: Run) -> bool:
    """A run that exited non-zero, timed out, gave no figure or reported an `error`: its value, if
    any, is not the code's figure."""
    return bool(r.error) or r.value is None or bool(r.report.get("error"))


def summary(fig: Figure, old: list[Run], new: list[Run]) -> dict[str, object]:
    """A figure's sides over their quiet successful runs (saturated and failed runs counted apart),
    and the verdict: None unless each side has MIN_RUNS of them."""
    def quiet(runs: list[Run]) -> list[float]:
        return [r.value for r in runs if r.value is not None and not failed(r) and not r.saturated]

    o, n = quiet(old), quiet(new)
    out: dict[str, object] = {"key": fig.key, "old_runs": [r.value for r in old], "new_runs": [r.value for r in new]}
    for side, runs, good in (("old", old, o), ("new", new, n)):
        out.update({f"{side}_quiet_runs": len(good), f"{side}_failed_runs": sum(failed(r) for r in runs),
                    f"{side}_saturated_runs": sum(r.saturated and not failed(r) for r in runs)})
    if not o or not n:
        out["within_1_1x"] = None
        return out
    om, nm = statistics.median(o), statistics.median(n)
    ratio = (om / nm if fig.higher_is_better else nm / om) if om and nm else None
    # One run a side is one sample of the machine's noise, not a comparison.
    enough = len(o) >= MIN_RUNS and len(n) >= MIN_RUNS
    out.update(old_median=round(om, 4), new_median=round(nm, 4), old_range=[min(o), max(o)],
               new_range=[min(n), max(n)], new_over_old=None if ratio is None else round(ratio, 3),
               within_1_1x=None if ratio is None or not enough else ratio <= 1.1)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default="", help=f"comma-separated figures of {[f.name for f in FIGURES]}")
    p.add_argument("--quick", action="store_true", help="each bench's smallest mode: check the comparison runs")
    p.add_argument("--max-busy", type=float, default=0.15, help="busy share above which a run is saturated")
    p.add_argument("--quiet-wait", type=float, default=60.0, help="seconds a run waits for a quiet machine")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per benchmark run")
    p.add_argument("--reports", type=Path, default=None, help="write every run's whole last-line JSON here")
    a = p.parse_args(argv)
    names = [x for x in a.only.split(",") if x]
    unknown = sorted(set(names) - {f.name for f in FIGURES})
    if unknown:
        p.error(f"--only: unknown figure(s) {', '.join(unknown)}")
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    figures = [f for f in FIGURES if not names or f.name in names]
    base = Path(tempfile.mkdtemp(prefix="ab-compare-"))
    sides: list[Side] = []
    try:
        for name, rev in (("old", a.old), ("new", a.new)):
            try:
                sides.append(Side(name, rev, checkout(rev, base, name)))
            except subprocess.CalledProcessError as e:
                print(f"ab_compare: cannot check out {rev!r}: {e.stderr.strip()}", file=sys.stderr)
                return 2
            got = imports_from(sides[-1].tree)
            if got != sides[-1].tree.resolve():
                print(f"ab_compare: {rev} would import the project from {got}, not its own tree", file=sys.stderr)
                return 2
        old, new = sides
        for fig in figures:
            for i in range(a.repeats):
                order = (old, new) if i % 2 == 0 else (new, old)
                for side in order:
                    r = run_once(side, fig, a.quick, a.max_busy, a.quiet_wait, a.timeout)
                    side.runs.append(r)
                    print(f"{fig.name:10s} {side.name} ({side.rev}): {r.value} in {r.seconds:.0f}s, "
                          f"busy {r.busy_before} load {r.load_before}{' SATURATED' if r.saturated else ''}"
                          f"{' ERROR ' + r.error if r.error else ''}", flush=True)
    finally:
        for s in sides:
            remove(s.tree)
        shutil.rmtree(base, ignore_errors=True)
    old, new = sides
    result: dict[str, object] = {"old": a.old, "new": a.new, "repeats": a.repeats,
                                 "saturated_runs": sum(r.saturated for s in sides for r in s.runs),
                                 "failed_runs": sum(failed(r) for s in sides for r in s.runs)}
    for fig in figures:
        result[fig.name] = summary(fig, [r for r in old.runs if r.figure == fig.name],
                                   [r for r in new.runs if r.figure == fig.name])
    if a.reports:
        a.reports.write_text(json.dumps([{"side": r.side, "rev": s.rev, "figure": r.figure, "report": r.report}
                                         for s in sides for r in s.runs], indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
