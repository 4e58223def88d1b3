"""The simulator counts the jobs that ran at a shape beyond their app's measured calibration range."""
from __future__ import annotations

import json
from pathlib import Path

import msgspec

from sim.calibration import AppCalibration, Calibration, save
from sim.simulator import SimConfig, simulate
from sim.trace import TraceJob, dump_trace
from sim.workload import WorkloadSpec, generate

THETA = [2.0, 0.3, 0.2, 0.05, 0.05]
SMALL = SimConfig(nodes=3, node_memory_mb=8192, node_vcores=8)


def calibration(most: tuple[int, int] | None) -> Calibration:
    """Every app calibrated on samples up to `most` workers and servers (None: no samples)."""
    samples = [] if most is None else [[1, 1, 2.0], [most[0], 1, 1.0], [1, most[1], 2.0]]
    app = AppCalibration(theta=THETA, loss_curve=[0.5, 2.0, 0.1], clocks_per_epoch=20.0, samples=samples)
    return Calibration(apps={a: app for a in ("mlr", "nmf", "lda", "lasso")})


def job(name: str, workers: int, servers: int, **kw: object) -> TraceJob:
    return msgspec.convert({"name": name, "arrival_s": 0.0, "app": "mlr", "threshold": 0.02, "workers": workers,
                            "servers": servers, "data_scale": 2.0, **kw}, TraceJob)


def test_a_job_at_a_shape_beyond_the_measured_range_is_counted() -> None:
    cal = calibration((2, 1))
    res = simulate([job("inside", 2, 1), job("beyond", 4, 1), job("servers", 1, 2)], "static", cal, SMALL)
    assert res.summary.finished == 3
    assert sorted(res.extrapolated_jobs) == ["beyond", "servers"]
    assert res.extrapolated_job_share == 2 / 3


def test_a_job_grown_beyond_the_range_by_the_policy_is_counted() -> None:
    cal = calibration((2, 2))
    grow = job("grow", 1, 1, max_workers=4, max_servers=2, data_scale=20.0)
    eps = simulate([grow], "eps", cal, SMALL)
    assert max(s[1] for s in eps.records[0].shapes) > 2                 # EPS grew it past 2 workers
    assert eps.extrapolated_jobs == ["grow"] and eps.extrapolated_job_share == 1.0
    static = simulate([grow], "static", cal, SMALL)                     # the same job kept at 1x1
    assert static.extrapolated_job_share == 0.0


def test_a_range_covering_the_generators_shapes_extrapolates_nothing() -> None:
    trace = generate(WorkloadSpec(jobs=6, window_s=600.0, data_scale=(2.0, 10.0), executor_memory_mb=1024), 5)
    res = simulate(trace, "eps", calibration((16, 8)), SMALL)
    assert res.summary.finished == 6 and res.extrapolated_job_share == 0.0
    # a calibration without samples (a speed function given, not measured) has nothing to extrapolate
    assert simulate(trace[:2], "static", calibration(None), SMALL).extrapolated_job_share == 0.0


def test_sim_runs_summary_names_the_extrapolated_jobs(tmp_path: Path) -> None:
    from elastane_cli.main import main
    cal = tmp_path / "cal.json"
    save(calibration((2, 1)), cal)
    trace = tmp_path / "trace.jsonl"
    trace.write_text(dump_trace([job("inside", 2, 1), job("beyond", 4, 1)]))
    out = tmp_path / "out"
    assert main(["sim", "run", str(trace), "--policy", "static", "--nodes", "3", "--calibration", str(cal),
                 "--out", str(out), "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["extrapolated_job_share"] == 0.5 and summary["extrapolated_jobs"] == ["beyond"]
