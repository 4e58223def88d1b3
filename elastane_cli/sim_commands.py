"""`elastane sim`: the discrete-event simulator (sim/) from the command line.

    elastane sim generate --jobs N --seed S [--window-s W] [-o TRACE]    a seeded Optimus §6 workload
    elastane sim run TRACE --policy P [--nodes N] [--out DIR]            replay it; table, records, plots
    elastane sim calibrate [--apps mlr,nmf,...] [-o FILE]                 measure the apps on a local cluster

`run` prints one table (mean JCT, makespan, mean utilization, DRF fairness loss ...) and writes
DIR/records.jsonl (one job a line: arrival, start, end, JCT, shape over time), DIR/summary.json
and the PNG plots (jct.png, utilization.png, running_jobs.png). Bad input (a trace line, an
unknown policy, a calibration without an app of the trace) exits 2 with a message.
"""
from __future__ import annotations

import argparse
import json
from typing import Any
from pathlib import Path

from sim import calibration as calibration_file
from sim.calibration import CalibrationError
from sim.simulator import SimConfig, known_policies, simulate
from sim.trace import TraceError, dump_trace, read_trace
from sim.workload import WorkloadSpec, generate

from .arg_types import non_negative_float, positive_int
from .context import CliContext
from .sim_harmony import run_harmony
from .errors import EXIT_OK, OperationFailed, UsageError
from .tables import render_table


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("sim", help="discrete-event simulator: replay a workload trace through the RM's policies")
    ssub = p.add_subparsers(dest="sim_command", required=True, metavar="SUBCOMMAND")

    g = ssub.add_parser("generate", parents=[common], help="write a seeded Optimus-style workload trace")
    g.add_argument("--jobs", type=positive_int("--jobs"), default=20)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--window-s", type=non_negative_float("--window-s"), default=12000.0,
                   help="arrivals are uniform over [0, window] seconds (Optimus §6.1: 12000)")
    g.add_argument("-o", "--output", type=Path, help="trace file (default: stdout)")
    g.set_defaults(func=cmd_generate)

    r = ssub.add_parser("run", parents=[common], help="replay a trace under a policy on a simulated cluster")
    r.add_argument("trace", type=Path)
    r.add_argument("--policy", default="static",
                   help=f"a registered policy, or one of the simulator's truth-fed Optimus variants "
                        f"({', '.join(known_policies())})")
    r.add_argument("--nodes", type=positive_int("--nodes"), default=8)
    r.add_argument("--node-memory-mb", type=positive_int("--node-memory-mb"), default=8192)
    r.add_argument("--node-vcores", type=positive_int("--node-vcores"), default=8)
    r.add_argument("--heartbeat-s", type=non_negative_float("--heartbeat-s"), default=1.0,
                   help="NM heartbeat interval (a real NM's: 1 s; larger runs big clusters faster)")
    r.add_argument("--policy-interval-s", type=non_negative_float("--policy-interval-s"), default=1.0,
                   help="seconds between policy rounds (the RM's: 1 s)")
    r.add_argument("--am-nodes", type=int, default=0,
                   help="extra nodes, labelled for AMs only, that run every AM (the Harmony paper's master instance)")
    r.add_argument("--step-s", type=non_negative_float("--step-s"), default=0.0,
                   help="event granularity: NM heartbeats, core ticks, policy rounds and AM allocates all every "
                        "STEP seconds (overrides --heartbeat-s / --policy-interval-s; e.g. 30 for 100 nodes x hours)")
    r.add_argument("--calibration", type=Path, default=calibration_file.DEFAULT_PATH)
    r.add_argument("--out", type=Path, default=Path("sim-out"), help="directory for records and plots")
    r.add_argument("--no-plots", action="store_true")
    r.set_defaults(func=cmd_run)

    c = ssub.add_parser("calibrate", parents=[common],
                        help="run short real jobs of each app on testbed hosts and write the coefficients")
    c.add_argument("--apps", default="mlr,nmf,lda,lasso", help="comma-separated apps")
    c.add_argument("-o", "--output", type=Path, default=calibration_file.DEFAULT_PATH)
    c.add_argument("--repeats", type=positive_int("--repeats"), default=3,
                   help="runs per app and shape, interleaved (>= 3; runs on a saturated machine are refused)")
    c.add_argument("--shapes", default=None,
                   help="comma-separated WxS shapes to run each app at (default: the eleven of sim_calibrate.SHAPES, "
                        "up to 16 workers and 16 servers)")
    c.add_argument("--epochs", type=positive_int("--epochs"), default=None, help="epochs of each calibration run (default 6)")
    c.set_defaults(func=cmd_calibrate)


def cmd_generate(args: argparse.Namespace, ctx: CliContext) -> int:
    try:
        jobs = generate(WorkloadSpec(jobs=args.jobs, window_s=args.window_s), args.seed)
    except ValueError as e:
        raise UsageError(str(e)) from None
    text = dump_trace(jobs)
    if args.output is None:
        ctx.out.write(text)
    else:
        try:
            args.output.write_text(text)
        except OSError as e:
            raise OperationFailed(f"cannot write {args.output}: {e.strerror or e}") from None
        ctx.out.write(f"wrote {len(jobs)} jobs to {args.output}\n")
    return EXIT_OK


def _fmt(x: object, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if x is None else f"{float(x) / scale:.{digits}f}"  # type: ignore[arg-type]


def cmd_run(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.policy not in known_policies():
        raise UsageError(f"unknown policy {args.policy!r}; known policies: {', '.join(known_policies())}")
    try:
        trace = read_trace(args.trace)
        cal = calibration_file.load(args.calibration)
        if args.heartbeat_s <= 0 or args.policy_interval_s <= 0:
            raise UsageError("--heartbeat-s and --policy-interval-s must be positive")
        if args.am_nodes < 0:
            raise UsageError(f"--am-nodes must be >= 0, got {args.am_nodes}")
        cfg = SimConfig(nodes=args.nodes, node_memory_mb=args.node_memory_mb, node_vcores=args.node_vcores,
                        heartbeat_s=args.heartbeat_s, policy_interval_s=args.policy_interval_s,
                        am_nodes=args.am_nodes, am_node_vcores=max(64, len(trace)),
                        am_node_memory_mb=max(65536, 1024 * len(trace)))
        if args.step_s > 0:
            cfg = cfg.coarse(args.step_s)
        if args.policy == "harmony":
            # Harmony is compared with isolated and naive co-location (elastane_cli/sim_harmony.py).
            return run_harmony(args, ctx, trace, cal, cfg)
        result = simulate(trace, args.policy, cal, cfg)
    except (TraceError, CalibrationError) as e:
        raise UsageError(str(e)) from None
    s = result.summary
    ctx.out.write(render_table(
        ["POLICY", "JOBS", "FINISHED", "MEAN-JCT-MIN", "MAKESPAN-H", "UTILIZATION-%", "USEFUL-%", "FAIRNESS-LOSS", "RESHAPES",
         "SIM-S"],
        [[args.policy, s.jobs, s.finished, _fmt(s.mean_jct_s, 60.0), _fmt(s.makespan_s, 3600.0, 2),
          _fmt(100.0 * s.mean_utilization), _fmt(100.0 * s.mean_useful_utilization), _fmt(s.mean_fairness_loss, digits=3), s.reshapes,
          _fmt(s.wall_s, digits=2)]]) + "\n")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "records.jsonl").open("w") as f:
            for rec in result.record_lines():
                f.write(json.dumps(rec) + "\n")
        (args.out / "summary.json").write_text(json.dumps({
            "policy": args.policy, **s.to_json(),
            # jobs that ran at a shape beyond the calibration's measured range (docs/simulator.md)
            "extrapolated_job_share": round(result.extrapolated_job_share, 4),
            "extrapolated_jobs": result.extrapolated_jobs}, indent=2) + "\n")
        written = ["records.jsonl", "summary.json"]
        if not args.no_plots:
            from sim.plots import write_plots  # noqa: PLC0415 (matplotlib is slow to import)
            jcts = [r.jct for r in result.records if r.jct is not None]
            written += [p.name for p in write_plots(args.out, args.policy, jcts, result.samples)]
    except OSError as e:
        raise OperationFailed(f"cannot write into {args.out}: {e.strerror or e}") from None
    ctx.out.write(f"wrote {', '.join(written)} in {args.out}\n")
    return EXIT_OK if s.finished == s.jobs else 1


def cmd_calibrate(args: argparse.Namespace, ctx: CliContext) -> int:
    from .sim_calibrate import CalibrationArgsError, calibrate, trace_extrapolation  # noqa: PLC0415 (starts a testbed)

    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    bad = [a for a in apps if a not in ("mlr", "nmf", "lda", "lasso")]
    if not apps or bad:
        raise UsageError(f"--apps: unknown app(s) {', '.join(bad) or '(none given)'}; apps: mlr, nmf, lda, lasso")

    shapes = _shapes(args.shapes) if args.shapes else None
    if args.repeats < 3:
        raise UsageError(f"--repeats: at least 3 runs per shape (their spread is reported), got {args.repeats}")

    def log(text: str) -> None:
        ctx.out.write(f"[calibrate] {text}\n")
        ctx.out.flush()
    try:
        kwargs: dict[str, Any] = {}
        if shapes:
            kwargs["shapes"] = shapes
        if args.epochs:
            kwargs["epochs"] = args.epochs
        cal = calibrate(args.output, apps, log=log, repeats=args.repeats, **kwargs)
    except CalibrationArgsError as e:
        raise UsageError(str(e)) from None
    except (RuntimeError, TimeoutError, OSError) as e:
        raise OperationFailed(f"calibration failed: {e}") from None
    ctx.out.write(f"wrote {args.output}\n")
    # Last line, JSON: what the fit says of itself, and how much of the default trace could run
    # beyond the measured shapes (an upper bound of any policy's extrapolated_job_share).
    ctx.out.write(json.dumps({
        "extrapolated_job_share": round(trace_extrapolation(cal), 4),
        "holdout_error": {n: a.holdout_error for n, a in cal.apps.items()},
        "holdout_error_max": {n: a.holdout_error_max for n, a in cal.apps.items()},
        "repeat_spread_max": {n: max((sp[3] for sp in a.shape_spread), default=None) for n, a in cal.apps.items()},
        "refused_samples": sum(bool(x.refused) for a in cal.apps.values() for x in a.shape_samples),
        "measured_range": {n: a.measured_range() for n, a in cal.apps.items()}}) + "\n")
    return EXIT_OK


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    """`--shapes 1x1,2x1`: (workers, servers) pairs, each at least 1 (UsageError naming the bad one)."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        w, sep, s = part.partition("x")
        if not sep or not w.isdigit() or not s.isdigit() or int(w) < 1 or int(s) < 1:
            raise UsageError(f"--shapes: {part!r} is not WORKERSxSERVERS with both at least 1")
        out.append((int(w), int(s)))
    if not out:
        raise UsageError("--shapes: no shape given")
    return tuple(out)
