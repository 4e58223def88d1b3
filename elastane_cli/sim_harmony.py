"""`elastane sim run TRACE --policy harmony`: Harmony against isolated and naive co-location.

The trace runs three times on the same simulated cluster (sim/harmony_compare.py): `isolated` (the
`static` policy, each job the shape it asks for, the co-location model's ISOLATED mode), `harmony`
(the `harmony` policy, the model's HARMONY mode: eq. 4.1 plus the arbiter's measured handoffs) and
`naive` (Harmony's groups, no arbiter). One table row per run (mean JCT, makespan, eq. 4.4 CPU /
network utilization over the makespan, the most jobs that ever shared hosts, pauses), then the
gains over isolated. DIR/records.jsonl holds the harmony run's jobs, DIR/summary.json every run
and the gains.
"""
from __future__ import annotations

import argparse
import json
from typing import Sequence

from sim.calibration import Calibration
from sim.harmony_compare import compare, gains
from sim.simulator import SimConfig
from sim.trace import TraceJob

from .context import CliContext
from .errors import EXIT_OK, OperationFailed
from .tables import render_table


def _fmt(x: object, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if x is None else f"{float(x) / scale:.{digits}f}"  # type: ignore[arg-type]


def run_harmony(args: argparse.Namespace, ctx: CliContext, trace: Sequence[TraceJob], cal: Calibration,
                cfg: SimConfig) -> int:
    """Run the comparison and write its table and files (module doc); exit 1 if a job did not finish."""
    out = compare(trace, cal, cfg)
    rows = []
    for name, o in out.items():
        s = o.result.summary
        rows.append([name, o.policy, s.jobs, s.finished, _fmt(s.mean_jct_s, 60.0), _fmt(s.makespan_s, 3600.0, 2),
                     _fmt(100.0 * o.cpu_utilization), _fmt(100.0 * o.net_utilization), o.max_jobs_sharing,
                     sum(r.pauses for r in o.result.records), _fmt(s.wall_s, digits=2)])
    ctx.out.write(render_table(["RUN", "POLICY", "JOBS", "FINISHED", "MEAN-JCT-MIN", "MAKESPAN-H", "CPU-UTIL-%",
                                "NET-UTIL-%", "MAX-SHARING", "PAUSES", "SIM-S"], rows) + "\n")
    g = {name: gains(out, name) for name in out if name != "isolated"}
    for name, v in g.items():
        ctx.out.write(f"{name} vs isolated: mean JCT {_fmt(v['jct_gain'], digits=2)}x, makespan "
                      f"{_fmt(v['makespan_gain'], digits=2)}x, CPU utilization {_fmt(v['util_gain'], digits=2)}x\n")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "records.jsonl").open("w") as f:
            for rec in out["harmony"].result.record_lines():
                f.write(json.dumps(rec) + "\n")
        summary = {"policy": "harmony", "runs": {n: o.to_json() for n, o in out.items()}, "gains_vs_isolated": g}
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as e:
        raise OperationFailed(f"cannot write into {args.out}: {e.strerror or e}") from None
    ctx.out.write(f"wrote records.jsonl (the harmony run), summary.json in {args.out}\n")
    done = all(o.result.summary.finished == o.result.summary.jobs for o in out.values())
    return EXIT_OK if done else 1


__all__ = ["run_harmony"]
