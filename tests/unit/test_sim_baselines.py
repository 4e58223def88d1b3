"""Fair baselines and the evidence rules of the simulator benches (issue 33 parts 3-4): Harmony's
isolated baselines, the clairvoyant bound, ratios over jobs finished in both runs, seeds and spread,
and the frozen default trace."""
from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from protocol.records import Resource
from sim.bounds import clairvoyant_bound, job_need, over_bound, srpt_completions
from sim.calibration import AppCalibration, Calibration
from sim.harmony_compare import (DOP_CANDIDATES, PER_JOB, at_dop, best_dop, harmony_dops, isolated_baselines,
                                 solo_jct_s, strongest)
from sim.job_record import JobRecord
from sim.metrics import Spread, completed_in_both, ratio, spread_keys
from sim.simulator import SimConfig, SimResult, simulate
from sim.trace import TraceJob
from sim.workload import CLUSTER_SPEC, WorkloadSpec, cluster_trace, generate, trace_fingerprint
from sim.workload_harmony import HarmonyWorkloadSpec
from sim.workload_harmony import generate as harmony_generate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))     # the benches and bench/support
from support.seeds import DEFAULT_SEEDS, parse_seeds  # type: ignore[import-not-found]


def app(theta: list[float]) -> AppCalibration:
    return AppCalibration(theta=theta, loss_curve=[0.5, 2.0, 0.1], clocks_per_epoch=10.0, am_start_s=2.0,
                          startup_s=3.0, finish_s=1.0, reshape_s=2.0, restart_s=5.0, pause_s=2.0)


def job(name: str = "j", **kw: object) -> TraceJob:
    base: dict[str, object] = {"name": name, "arrival_s": 0.0, "app": "mlr", "threshold": 1e-6, "workers": 2,
                               "servers": 2, "max_epochs": 10}
    base.update(kw)
    return TraceJob(**base)  # type: ignore[arg-type]


# ----- best DoP and the stronger isolated baseline ----------------------------------------------

def test_best_dop_is_the_least_solo_time_over_the_candidates() -> None:
    # T(d) = 64/d + 1 + 0.6 d per epoch (θ3 on the workers): 34.2, 19.4, 13.8, 14.6 at 2, 4, 8, 16
    a = app([64.0, 1.0, 0.0, 0.6, 0.0])
    j = job()
    times = {d: solo_jct_s(j, a, d) for d in DOP_CANDIDATES}
    assert best_dop(j, a) == min(times, key=lambda d: times[d])
    assert best_dop(j, a) == 8
    # eq. 4.2 alone (COMP parallelises, COMM does not): the most hosts win for a job alone
    assert best_dop(j, app([64.0, 1.0, 0.0, 0.0, 0.0])) == 16
    # a tie goes to the fewer hosts
    assert best_dop(j, app([0.0, 1.0, 0.0, 0.0, 0.0])) == 2
    with pytest.raises(ValueError):
        best_dop(j, a, ())


def test_at_dop_keeps_the_job_within_its_bounds() -> None:
    j = job(min_workers=1, min_servers=1, max_workers=4, max_servers=4)
    d = at_dop(j, 8)
    assert (d.workers, d.servers) == (8, 8) and d.shape_max == (8, 8) and d.shape_min == (1, 1)
    assert at_dop(j, 2).shape_max == (4, 4)
    with pytest.raises(ValueError):
        at_dop(j, 0)


class _Run:
    """A stand-in RunOutcome for `strongest`: what it reads (mean JCT, finished / jobs)."""

    def __init__(self, mean: float, finished: int, jobs: int) -> None:
        self.mean_jct_s = mean

        class S:
            pass
        self.result = S()
        self.result.summary = S()  # type: ignore[attr-defined]
        self.result.summary.finished = finished  # type: ignore[attr-defined]
        self.result.summary.jobs = jobs  # type: ignore[attr-defined]


def test_the_strongest_baseline_is_the_least_mean_jct_among_runs_that_finished_everything() -> None:
    runs = {2: _Run(900.0, 10, 10), 4: _Run(700.0, 10, 10), 8: _Run(500.0, 9, 10), PER_JOB: _Run(800.0, 10, 10)}
    name, run = strongest(runs)  # type: ignore[arg-type]
    # DoP 8's mean is least, but it left a job unfinished: its mean covers fewer jobs
    assert name == 4 and run.mean_jct_s == 700.0
    runs[PER_JOB] = _Run(650.0, 10, 10)
    assert strongest(runs)[0] == PER_JOB  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        strongest({2: _Run(1.0, 1, 2)})  # type: ignore[dict-item]


def test_isolated_baselines_run_every_candidate_and_pick_the_least_mean_jct() -> None:
    trace, cal, _ = harmony_generate(HarmonyWorkloadSpec(settings=1, nodes=16, job_minutes=(5.0, 10.0)), 3)
    cfg = SimConfig(nodes=16, node_memory_mb=32 * 1024, node_vcores=8, am_nodes=1, am_node_vcores=64,
                    am_node_memory_mb=64 * 1024, sample_s=60.0).coarse(30.0)
    iso = isolated_baselines(trace, cal, cfg)
    assert sorted(iso.fixed) == [2, 4, 8, 16]
    for d, run in iso.fixed.items():            # each fixed run really ran at its DoP
        assert run.result.summary.finished == len(trace)
        assert all(r.shapes and r.shapes[0][1:] == (d, d) for r in run.result.records)
    # eq. 4.2: every job's best alone is DoP 16, so the per-job baseline is that run
    assert set(iso.per_job_dops.values()) == {16} and iso.per_job.mean_jct_s == iso.fixed[16].mean_jct_s
    name, best = iso.best()
    assert best.mean_jct_s == min(r.mean_jct_s or 0.0 for r in iso.candidates().values())
    assert name in (*iso.fixed, PER_JOB)


def test_harmony_dops_is_the_worker_count_held_longest() -> None:
    rec = JobRecord("a", "mlr", "u", "q", end=100.0,
                    shapes=[(0.0, 1, 1), (10.0, 4, 4), (30.0, 0, 0), (40.0, 8, 8), (90.0, 4, 4)])
    # 1 for 10 s, 4 for 20 + 10 s, paused 10 s, 8 for 50 s
    res = SimResult("harmony", [rec], [], None)  # type: ignore[arg-type]
    assert harmony_dops(res) == {"a": 8}
    rec.shapes = [(0.0, 2, 2), (50.0, 3, 3)]      # a tie (50 s each): the fewer hosts
    assert harmony_dops(res) == {"a": 2}


# ----- ratios over the jobs both runs finished, and spread over seeds ---------------------------

def test_a_jct_ratio_covers_only_jobs_finished_in_both_runs() -> None:
    off = [("a", 10.0), ("b", None), ("c", 30.0), ("d", 40.0)]
    on = [("a", 5.0), ("b", 8.0), ("c", None), ("d", 20.0)]
    a, b = completed_in_both(off, on)
    assert (a, b) == ([10.0, 40.0], [5.0, 20.0])       # b failed off, c stalled on: neither counts
    assert ratio(statistics.fmean(a), statistics.fmean(b)) == 2.0
    assert completed_in_both([("a", None)], [("a", 1.0)]) == ([], [])


def test_gang_admissions_gain_leaves_failed_jobs_out() -> None:
    import importlib  # noqa: PLC0415
    gang_admission = importlib.import_module("gang_admission")      # bench/gang_admission.py
    gain, n = gang_admission.gain_completed_in_both([("a", 100.0), ("b", None)], [("a", 50.0), ("b", 9.0)])
    assert (gain, n) == (2.0, 1)
    assert gang_admission.gain_completed_in_both([("a", None)], [("a", 1.0)]) == (None, 0)


def test_spread_is_median_min_and_max_of_the_values_present() -> None:
    sp = Spread.of([1.2, None, 1.8, 1.5, 0.9])
    assert sp == Spread(1.35, 0.9, 1.8, 4)
    # `_n`: how many seeds gave a value (a median over 1 of 5 seeds is not one over 5).
    assert sp is not None and sp.keys("g") == {"g": 1.35, "g_min": 0.9, "g_max": 1.8, "g_n": 4}
    assert spread_keys("g", [None]) == {"g": None, "g_min": None, "g_max": None, "g_n": 0}
    assert ratio(3.0, 0.0) is None and ratio(None, 1.0) is None and ratio(3.0, 2.0) == 1.5


def test_seeds_default_to_five_and_take_lists_and_ranges() -> None:
    assert len(DEFAULT_SEEDS) >= 5 and parse_seeds("1-5") == list(DEFAULT_SEEDS)
    assert parse_seeds("6-8,3,7") == [6, 7, 8, 3]
    for bad in ("", "x", "5-3", "1,,a"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


# ----- the clairvoyant bound ----------------------------------------------------------------------

def test_srpt_runs_the_shortest_remaining_job_first_and_preempts() -> None:
    # 0: 10 s from t=0; 1: 2 s from t=1 preempts it; 2: 1 s from t=20
    assert srpt_completions([0.0, 1.0, 20.0], [10.0, 2.0, 1.0]) == pytest.approx([12.0, 3.0, 21.0])
    assert srpt_completions([5.0], [1.0]) == [6.0]


def test_job_need_is_the_fastest_shape_and_least_area_within_bounds() -> None:
    a = app([8.0, 0.5, 0.0, 0.0, 0.0])          # T(w, s) = 8/w + 0.5 per epoch
    j = job(workers=1, servers=1, min_workers=1, min_servers=1, max_workers=4, max_servers=2, max_epochs=10,
            executor_memory_mb=1024, executor_vcores=1)
    need = job_need(j, a)
    epochs = need.train_s / (8 / 4 + 0.5)
    assert epochs == pytest.approx(a.epochs_to_converge(j.threshold, 10))
    assert need.solo_s == pytest.approx(2.0 + 3.0 + need.train_s + 1.0)
    # the least vCore-seconds: (w + s) T(w, s) over w <= 4, s <= 2
    least = min((w + s) * (8 / w + 0.5) for w in range(1, 5) for s in range(1, 3)) * epochs
    assert need.area[1] == pytest.approx(least)


@pytest.mark.parametrize("policy", ["static", "drf", "optimus-truth", "dorm"])
def test_the_clairvoyant_bound_is_below_every_policys_mean_jct_and_makespan(policy: str) -> None:
    a = app([20.0, 0.5, 0.3, 0.05, 0.05])
    cal = Calibration(apps={x: a for x in ("mlr", "nmf", "lda", "lasso")}, measured_on="test")
    trace = generate(WorkloadSpec(jobs=8, window_s=200.0, data_scale=(2.0, 10.0), executor_memory_mb=1024), 4)
    cfg = SimConfig(nodes=2, node_memory_mb=8192, node_vcores=8)
    b = clairvoyant_bound(trace, cal, Resource(8192 * 2, 16))
    s = simulate(trace, policy, cal, cfg).summary
    assert s.finished == len(trace) and s.mean_jct_s is not None and s.makespan_s is not None
    assert b.mean_jct_s <= s.mean_jct_s and b.makespan_s <= s.makespan_s
    over = over_bound(b.mean_jct_s, s.mean_jct_s)
    assert over is not None and 0.0 < over <= 1.0


def test_the_fluid_term_binds_a_crowded_cluster() -> None:
    a = app([20.0, 0.5, 0.0, 0.0, 0.0])
    cal = Calibration(apps={"mlr": a}, measured_on="test")
    trace = [job(f"j{i}", workers=1, servers=1, min_workers=1, min_servers=1, max_workers=8, max_servers=8)
             for i in range(20)]
    roomy = clairvoyant_bound(trace, cal, Resource(10 ** 9, 10 ** 6))
    tight = clairvoyant_bound(trace, cal, Resource(2048, 2))
    assert roomy.mean_jct_by == "solo" and tight.mean_jct_by.startswith("fluid")
    assert tight.mean_jct_s > roomy.mean_jct_s
    with pytest.raises(ValueError):
        clairvoyant_bound([], cal, Resource(1, 1))


# ----- the frozen default trace -------------------------------------------------------------------

# What `generate` draws for bench/policies_sim.py's default trace (CLUSTER_SPEC at unit rate), seeds
# 1-5, frozen by issue 33. A change here means the default trace changed: every earlier figure on
# it stops being comparable. Make a new spec instead.
FROZEN = {1: "4c2fd0274e48cb94", 2: "6b15604b4f2f7958", 3: "f299c90030f9dbcc", 4: "ab5a58739418e064",
          5: "e482000371449a7c"}


def test_the_default_trace_is_frozen() -> None:
    assert (CLUSTER_SPEC.jobs, CLUSTER_SPEC.threshold_min, CLUSTER_SPEC.threshold_max, CLUSTER_SPEC.data_scale,
            CLUSTER_SPEC.epochs, CLUSTER_SPEC.growth, CLUSTER_SPEC.users) == (60, 0.0005, 0.005, (20.0, 120.0),
                                                                             (20, 60), 4, 4)
    unit = replace(CLUSTER_SPEC, arrivals="poisson", rate_per_s=1.0)
    assert {seed: trace_fingerprint(generate(unit, seed)) for seed in FROZEN} == FROZEN


def test_the_default_trace_scales_only_the_arrivals() -> None:
    a = app([2.0, 0.3, 0.2, 0.05, 0.05])
    cal = Calibration(apps={x: a for x in ("mlr", "nmf", "lda", "lasso")}, measured_on="test")
    ct = cluster_trace(cal, Resource(8192 * 16, 128), Resource(1024, 1), 1, 0.75)
    unit = generate(replace(CLUSTER_SPEC, arrivals="poisson", rate_per_s=1.0), 1)
    assert [replace_arrival(j) for j in ct.jobs] == [replace_arrival(j) for j in unit]
    for got, drawn in zip(ct.jobs, unit):
        assert got.arrival_s == pytest.approx(drawn.arrival_s / ct.rate_per_s, abs=1e-3)


def replace_arrival(j: TraceJob) -> TraceJob:
    import msgspec  # noqa: PLC0415
    return msgspec.structs.replace(j, arrival_s=0.0)


def test_the_benches_refuse_bad_seeds_with_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib  # noqa: PLC0415
    for name in ("policies_sim", "gang_admission", "optimus_sim"):
        bench = importlib.import_module(name)
        with pytest.raises(SystemExit) as e:
            bench.main(["--seeds", "5-1"])
        assert e.value.code == 2
        assert "--seeds" in capsys.readouterr().err


def test_policies_sim_takes_warm_only_for_the_optimus_paper(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib  # noqa: PLC0415
    bench = importlib.import_module("policies_sim")
    for argv in (["--warm"], ["--paper", "dorm", "--warm"]):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2
        assert "--warm is for --paper optimus" in capsys.readouterr().err
