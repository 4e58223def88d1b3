"""The calibration's arithmetic (sim/calibration.py fit_app, elastane_cli/sim_calibrate.py), without a cluster."""
from __future__ import annotations

import msgspec
import pytest

from elastane_cli.sim_calibrate import (SHAPES, CalibrationArgsError, CalibrationPlan, JobRun, Measured, app_calibration,
                                       check_specs, run_costs, split_costs)
from protocol.ps_status import EpochResult, PsStatus
from models.ps_iteration_time import EpochTimeModel
from sim.calibration import (MIN_REPEATS, AppCalibration, CalibrationFitError, CalibrationSample, fit_app,
                             holdout_shapes, shape_stats)
from sim.workload import WorkloadSpec

TRUTH = EpochTimeModel((2.0, 0.3, 0.2, 0.05, 0.05))


def samples_of(truth: EpochTimeModel, shapes: tuple[tuple[int, int], ...], noise: tuple[float, ...] = (1.0, 1.0, 1.0),
               refused: dict[tuple[int, int], float] | None = None) -> list[CalibrationSample]:
    """Per shape one sample per noise factor (truth x factor); `refused`: an extra sample at that
    shape, `factor` x the truth, taken on a saturated machine."""
    out = [CalibrationSample(workers=w, servers=s, epoch_s=truth.epoch_time(w, s) * f, repeat=i,
                             busy_share=0.5, load_per_core=0.5)
           for i, f in enumerate(noise) for w, s in shapes]
    for (w, s), f in (refused or {}).items():
        out.append(CalibrationSample(workers=w, servers=s, epoch_s=truth.epoch_time(w, s) * f, repeat=9,
                                     busy_share=0.99, load_per_core=9.0, refused="machine 99% busy"))
    return out


def test_every_app_runs_at_every_calibrated_shape_and_a_shape_its_data_cannot_split_is_refused_up_front() -> None:
    """A full calibration stopped at NMF 16x4 (12 input blocks for 16 workers) after 19 runs."""
    check_specs(["mlr", "nmf", "lda", "lasso"], SHAPES)
    with pytest.raises(CalibrationArgsError, match="nmf at 32x1: workers"):
        check_specs(["nmf"], ((32, 1),))


def test_costs_add_up_to_the_time_outside_training() -> None:
    assert split_costs(20.0, 10.0, 6.0, 7.0) == (6.0, 1.0, 3.0)
    # reports seen late: the AM start and startup give way so nothing is negative
    assert split_costs(10.0, 5.0, 6.0, 7.0) == (5.0, 0.0, 0.0)
    runs = [JobRun("a", jct_s=20.0, first_report=6.0, started=7.0, epochs=2, epoch_times=[5.0, 5.0]),
            JobRun("b", jct_s=14.0, first_report=5.0, started=5.5, epochs=3, epoch_times=[3.0, 3.0])]
    # b trained 3 epochs, one after its last report: at the median epoch time
    assert runs[1].training_s == pytest.approx(9.0)
    # the median of each cost over the runs: (6, 1, 3) and (5, 0, 0)
    assert run_costs(runs) == pytest.approx((5.5, 0.5, 1.5))


def test_a_refused_sample_enters_no_fit() -> None:
    clean = fit_app(samples_of(TRUTH, SHAPES))
    # a saturated run 5x slower at every shape changes nothing: not the medians, not theta
    dirty = fit_app(samples_of(TRUTH, SHAPES, refused={sh: 5.0 for sh in SHAPES}))
    assert dirty.theta == clean.theta and dirty.fitted == clean.fitted
    assert dirty.refused == len(SHAPES) and clean.refused == 0
    for w, s in SHAPES:
        assert EpochTimeModel(dirty.theta).epoch_time(w, s) == pytest.approx(TRUTH.epoch_time(w, s), rel=1e-3)


def test_a_shape_needs_its_repeats_and_reports_their_spread() -> None:
    shapes = ((1, 1), (2, 1))
    smp = samples_of(TRUTH, shapes, noise=(1.0, 1.1, 0.9))
    # (2, 1) loses two repeats to refusal: fewer than MIN_REPEATS accepted, so it is not a statistic
    smp = [x if not (x.shape == (2, 1) and x.repeat > 0) else msgspec.structs.replace(x, refused="saturated")
           for x in smp]
    stats, too_few = shape_stats(smp)
    assert [(st.workers, st.servers) for st in stats] == [(1, 1)] and too_few == [(2, 1)]
    st = stats[0]
    t = TRUTH.epoch_time(1, 1)
    assert st.repeats == MIN_REPEATS == 3
    assert st.median_s == pytest.approx(t)
    assert st.spread == pytest.approx((1.1 - 0.9) * t / t)
    with pytest.raises(CalibrationFitError):
        fit_app([x for x in smp if x.shape == (2, 1)])       # one accepted sample: nothing to fit


def test_holdout_shapes_are_inner_and_leave_the_range_fitted() -> None:
    held = holdout_shapes(SHAPES)
    assert held, "ten shapes leave some to hold out"
    rest = [sh for sh in SHAPES if sh not in held]
    assert len(rest) >= 5
    for role in (0, 1):     # the fitted shapes still reach the smallest and the largest of each role
        assert min(sh[role] for sh in rest) == min(sh[role] for sh in SHAPES)
        assert max(sh[role] for sh in rest) == max(sh[role] for sh in SHAPES)
    assert holdout_shapes(SHAPES[:5]) == []


def test_the_fit_reports_its_error_on_held_out_shapes() -> None:
    exact = fit_app(samples_of(TRUTH, SHAPES))
    assert exact.held_out and exact.holdout_error is not None and exact.holdout_error < 1e-3
    # Measured medians off the form at the held-out shapes: theta (fitted without them) predicts
    # the form there, so the error is exactly how far the medians are off.
    held = {(h.workers, h.servers) for h in exact.held_out}
    off = [msgspec.structs.replace(x, epoch_s=(x.epoch_s or 0) * 1.3) if x.shape in held else x
           for x in samples_of(TRUTH, SHAPES)]
    fit = fit_app(off)
    assert fit.theta == exact.theta
    assert fit.holdout_error == pytest.approx(0.3 / 1.3, rel=1e-3)
    assert fit.holdout_error_max == pytest.approx(0.3 / 1.3, rel=1e-3)


def test_an_app_calibration_keeps_every_sample_and_fits_only_accepted_ones() -> None:
    smp = samples_of(TRUTH, SHAPES, refused={(1, 1): 4.0})
    hist = [(0, 10.0)] + [(k, 10.0 / (0.5 * k + 1) + 1) for k in range(1, 8)]
    measured = [Measured("mlr", JobRun("r", final_status="SUCCEEDED", jct_s=30.0, first_report=2.0, started=4.0,
                                       epochs=6, iterations=60, epoch_times=[x.epoch_s or 0.0] * 6,
                                       objectives=hist, requested=x.shape), x) for x in smp]
    logs: list[str] = []
    cal = app_calibration("mlr", measured, 6, logs.append)
    assert cal is not None
    assert len(cal.shape_samples) == len(smp) and sum(bool(x.refused) for x in cal.shape_samples) == 1
    assert cal.holdout_error is not None and cal.holdout_samples
    assert cal.measured_range() == (16, 16)
    assert all(sp[2] == 3 for sp in cal.shape_spread)
    assert msgspec.json.decode(msgspec.json.encode(cal), type=AppCalibration) == cal


def test_the_plan_covers_the_simulators_shapes_within_the_machine() -> None:
    spec = WorkloadSpec()
    most = (4 * spec.growth, 2 * spec.growth)        # sim/workload.py: 1-4 workers, 1-2 servers, x growth
    assert max(w for w, _ in SHAPES) >= most[0] and max(s for _, s in SHAPES) >= most[1]
    for cores in (2, 16):
        plan = CalibrationPlan.for_machine(SHAPES, cores=cores)
        assert all(plan.fits(w, s) for w, s in SHAPES)
        assert plan.hosts * plan.host_cpus <= 0.75 * cores + 1e-6     # a quarter left to the master
    assert CalibrationPlan.for_machine(SHAPES, cores=16).core_per_vcore == pytest.approx(0.5)


def test_the_shipped_calibration_loads_with_its_measured_range() -> None:
    from sim.calibration import load
    cal = load()
    assert set(cal.apps) == {"mlr", "nmf", "lda", "lasso"}
    for name, app in cal.apps.items():
        assert app.measured_range() is not None, name


@pytest.mark.parametrize("bad", ["2", "0x1", "1x", "ax2", ","])
def test_calibrate_refuses_bad_shapes(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    from elastane_cli.main import main
    assert main(["sim", "calibrate", "--shapes", bad, "-o", "/nonexistent/x.json"]) == 2
    assert "--shapes" in capsys.readouterr().err


def test_calibrate_refuses_fewer_than_three_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    from elastane_cli.main import main
    assert main(["sim", "calibrate", "--repeats", "2", "-o", "/nonexistent/x.json"]) == 2
    assert "--repeats" in capsys.readouterr().err


def test_a_runs_epochs_come_from_the_ams_final_status_when_the_polls_missed_them() -> None:
    run = JobRun("short", final_status="SUCCEEDED", epochs=2, epoch_times=[])     # ended before a report came
    run.fill_from_status(PsStatus(initial_objective=9.0, objective_history=[
        EpochResult(epoch=0, objective=5.0, epoch_time_s=0.7, time=1.0),
        EpochResult(epoch=1, objective=4.0, epoch_time_s=0.5, time=1.5),
        EpochResult(epoch=2, objective=3.5, epoch_time_s=0.6, time=2.1)]))
    assert run.epoch_times == [0.7, 0.5, 0.6] and run.epochs == 3
    assert run.objectives == [(0, 9.0), (1, 5.0), (2, 4.0), (3, 3.5)]
    assert run.epoch_wall_s == pytest.approx(0.55)             # the median after the first epoch
    kept = JobRun("r", epoch_times=[1.0, 2.0], epochs=2)
    kept.fill_from_status(PsStatus())                           # no status file: the polled figures stay
    assert kept.epoch_times == [1.0, 2.0]


def test_the_shipped_calibration_covers_the_default_trace_and_a_narrower_one_would_not() -> None:
    from elastane_cli.sim_calibrate import trace_extrapolation
    from sim.calibration import load
    shipped = load()
    grid = (max(w for w, _ in SHAPES), max(s for _, s in SHAPES))
    assert all(a.measured_range() == grid for a in shipped.apps.values())     # the full calibration's 16 x 16
    assert trace_extrapolation(shipped, (1, 2)) == 0.0

    def upto(rows: list[list[float]]) -> list[list[float]]:
        return [r for r in rows if r[0] <= 4 and r[1] <= 3]
    narrow = msgspec.structs.replace(shipped, apps={
        n: msgspec.structs.replace(a, samples=upto(a.samples), holdout_samples=upto(a.holdout_samples))
        for n, a in shipped.apps.items()})
    assert all(a.measured_range() == (4, 2) for a in narrow.apps.values())
    assert trace_extrapolation(narrow, (1,)) > 0           # jobs may grow to 16 x 8: measured to 4 x 2
