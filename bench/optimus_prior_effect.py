"""What Optimus's built-in priors are worth in the simulator, against priors from other sources.

    .venv/bin/python bench/optimus_prior_effect.py [--seeds 1,2,3,4,5] [--jobs 60] [--nodes 16]

Optimus seeds every job's speed fit with its app's prior (models/optimus_fit.py `APP_PRIORS`,
rm/policies/optimus_priors.py). The built-in priors are the epoch-time θ of the testbed
calibration shipped before today's, and the simulator's truth (sim/calibration.json) is a later
calibration of the same apps on the same testbed: the policy's prior is an earlier measurement of
what the simulator runs. This bench measures what that buys: the default trace
(bench/policies_sim.py's, `sim.workload.cluster_trace` at load 0.75) under `optimus` with

- `built_in`: today's priors;
- `dev_machine`: the priors they replaced (`DEV_MACHINE_PRIORS`: a 2026-11-26 calibration on the
  dev machine, two NMs sharing its cores, before calibrations refused a busy machine's samples);
- `reference`: no per-app prior, so the fit falls back to the paper's ResNet-50 reference
  (`SYNC_REFERENCE` / `ASYNC_REFERENCE`, Optimus Table 2): a source independent of our apps;
- `flat`: every app's prior θ = (1, 0, 0, 0, 0), epoch time 1/w: workers scale perfectly and
  servers cost nothing, a prior that knows nothing of any app;
- `simulated_truth`: every app's prior is the θ the simulator runs it with (the calibration
  file's): the prior a perfect calibration would give; the fit still scales it to each job and
  moves it with the job's samples, so this is not Optimus with the true speed function
  (bench/policies_sim.py's optimus-true-speed is);

and DRF on the same traces as the common baseline. Only the prior changes between the Optimus
runs of a seed (the module's `APP_PRIORS` table is swapped in this process and `app_prior`'s cache
cleared; nothing else of the policy is touched).

A seed's ratio of mean JCTs covers only the jobs both runs finished (sim/metrics.py
`jct_gain_in_both`): each run's own finished-jobs mean would compare different job sets. How many
jobs each run finished is given beside the ratios (`drf_finished`, `optimus_finished`, out of
`trace_jobs`, per seed).

Last line, JSON: {"seeds", "jobs", "trace_jobs", "drf_mean_jct_s", "drf_finished",
"optimus_mean_jct_s": {variant: [per seed]}, "optimus_finished": {variant: [per seed]},
"jct_ratio_vs_built_in": {variant: {"median", "min", "max", "n"}} (variant's mean JCT over built_in's:
> 1 means the built-in priors helped), "optimus_jct_gain_vs_drf": {variant: {"median", "min", "max", "n"}}}
(`n`: the seeds that gave a ratio).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models import optimus_fit  # noqa: E402
from protocol.records import Resource  # noqa: E402
from sim import calibration as calibration_file  # noqa: E402
from sim.metrics import jct_gain_in_both  # noqa: E402
from sim.sim_job import JobTimings  # noqa: E402
from sim.simulator import SimConfig, simulate  # noqa: E402
from sim.workload import CLUSTER_SPEC, cluster_trace  # noqa: E402

FLAT = (1.0, 0.0, 0.0, 0.0, 0.0)
# The built-in priors until 2026-11-30 (models/optimus_fit.py's history): `elastane sim calibrate` on
# the dev machine, 2026-11-26.
DEV_MACHINE_PRIORS: dict[str, tuple[float, float, float, float, float]] = {
    "mlr": (0.678, 0.0677, 0.0152, 0.0646, 0.0),
    "nmf": (0.914589, 0.19257, 0.0, 0.0, 0.118368),
    "lda": (1.319682, 0.0, 0.056166, 0.0, 0.0),
    "lasso": (0.395726, 0.0, 0.0, 0.0, 0.395242),
}
VARIANTS = ("built_in", "dev_machine", "reference", "flat", "simulated_truth")


@contextmanager
def priors(variant: str, cal: calibration_file.Calibration) -> Iterator[None]:
    """Optimus's per-app priors replaced by `variant`'s for the duration (restored after)."""
    saved = dict(optimus_fit.APP_PRIORS)
    table = optimus_fit.APP_PRIORS
    if variant == "reference":
        table.clear()
    elif variant == "flat":
        for app in list(table):
            table[app] = FLAT
    elif variant == "dev_machine":
        table.update(DEV_MACHINE_PRIORS)
    elif variant == "simulated_truth":
        for app in list(table):
            t = cal.apps[app].theta
            table[app] = (t[0], t[1], t[2], t[3], t[4])
    optimus_fit.app_prior.cache_clear()
    try:
        yield
    finally:
        table.clear()
        table.update(saved)
        optimus_fit.app_prior.cache_clear()


Jcts = list[tuple[str, Optional[float]]]      # one run's (job name, JCT or None)


def spread(values: list[Optional[float]]) -> dict[str, Optional[float]]:
    """Median, min, max of the values present and how many there were (`n`)."""
    vs = [v for v in values if v is not None]
    if not vs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(vs), 3), "min": round(min(vs), 3), "max": round(max(vs), 3),
            "n": len(vs)}


def ratios(num: list[Jcts], den: list[Jcts]) -> list[Optional[float]]:
    """Per seed, `num`'s mean JCT over `den`'s over the jobs both runs finished."""
    return [jct_gain_in_both(a, b, digits=6) for a, b in zip(num, den)]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--jobs", type=int, default=60)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--calibration", type=Path, default=calibration_file.DEFAULT_PATH)
    ns = p.parse_args(argv)
    try:
        seeds = [int(s) for s in ns.seeds.split(",") if s]
    except ValueError:
        p.error(f"--seeds: comma-separated integers, got {ns.seeds!r}")
    if not seeds or ns.jobs < 1 or ns.nodes < 1:
        p.error("--seeds, --jobs and --nodes must name at least one seed, job and node")
    try:
        cal = calibration_file.load(ns.calibration)
    except calibration_file.CalibrationError as e:
        p.error(str(e))
    cfg = SimConfig(nodes=ns.nodes, node_memory_mb=8192, node_vcores=8, heartbeat_s=2.0,
                    timings=JobTimings(allocate_interval_s=2.0, pending_interval_s=0.5))
    cluster = Resource(8192 * ns.nodes, 8 * ns.nodes)
    am = Resource(cfg.timings.am_memory_mb, 1)
    spec = replace(CLUSTER_SPEC, jobs=ns.jobs)
    jct: dict[str, list[Optional[float]]] = {v: [] for v in VARIANTS}
    runs: dict[str, list[Jcts]] = {v: [] for v in VARIANTS}
    finished: dict[str, list[int]] = {v: [] for v in VARIANTS}
    drf: list[Optional[float]] = []
    drf_runs: list[Jcts] = []
    drf_finished: list[int] = []
    trace_jobs: list[int] = []
    for seed in seeds:
        trace = cluster_trace(cal, cluster, am, seed, 0.75, spec).jobs
        trace_jobs.append(len(trace))
        res = simulate(trace, "drf", cal, cfg)
        drf.append(res.summary.mean_jct_s)
        drf_runs.append([(r.name, r.jct) for r in res.records])
        drf_finished.append(res.summary.finished)
        for v in VARIANTS:
            with priors(v, cal):
                res = simulate(trace, "optimus", cal, cfg)
            jct[v].append(res.summary.mean_jct_s)
            runs[v].append([(r.name, r.jct) for r in res.records])
            finished[v].append(res.summary.finished)
        print(f"seed {seed}: drf {drf[-1]}, " + ", ".join(f"{v} {jct[v][-1]}" for v in VARIANTS), file=sys.stderr)

    out: dict[str, Any] = {
        "seeds": seeds, "jobs": ns.jobs, "nodes": ns.nodes, "trace_jobs": trace_jobs, "drf_mean_jct_s": drf,
        "drf_finished": drf_finished, "optimus_mean_jct_s": jct, "optimus_finished": finished,
        "jct_ratio_vs_built_in": {v: spread(ratios(runs[v], runs["built_in"])) for v in VARIANTS if v != "built_in"},
        "optimus_jct_gain_vs_drf": {v: spread(ratios(drf_runs, runs[v])) for v in VARIANTS}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
