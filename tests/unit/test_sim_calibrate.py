"""The calibration's arithmetic (elastane_cli/sim_calibrate.py), without a cluster."""
from __future__ import annotations

import msgspec
import pytest

from elastane_cli.sim_calibrate import JobRun, merge_passes, run_costs, split_costs
from models.ps_iteration_time import EpochTimeModel
from sim.calibration import AppCalibration, Calibration


def test_costs_add_up_to_the_time_outside_training() -> None:
    assert split_costs(20.0, 10.0, 6.0, 7.0) == (6.0, 1.0, 3.0)
    # reports seen late: the AM start and startup give way so nothing is negative
    assert split_costs(10.0, 5.0, 6.0, 7.0) == (5.0, 0.0, 0.0)
    runs = [JobRun("a", jct_s=20.0, first_report=6.0, started=7.0, epochs=2, epoch_times=[5.0, 5.0]),
            JobRun("b", jct_s=14.0, first_report=5.0, started=5.5, epochs=3, epoch_times=[3.0, 3.0])]
    # b trained 3 epochs, one after its last report: at the median epoch time
    assert runs[1].training_s == pytest.approx(9.0)
    assert run_costs(runs) == pytest.approx((5.0, 0.0, 0.0))


def test_merged_passes_keep_the_fastest_epoch_per_shape() -> None:
    truth = EpochTimeModel((2.0, 0.3, 0.2, 0.05, 0.05))
    shapes = [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2)]

    def one_pass(slow: dict[tuple[int, int], float], costs: tuple[float, float, float]) -> Calibration:
        app = AppCalibration(theta=list(truth.theta), loss_curve=[0.5, 2.0, 0.1],
                             samples=[[w, s, truth.epoch_time(w, s) * slow.get((w, s), 1.0)] for w, s in shapes],
                             am_start_s=costs[0], startup_s=costs[1], finish_s=costs[2])
        return Calibration(apps={"mlr": app})
    a = one_pass({(1, 1): 2.0, (4, 1): 1.5}, (5.0, 1.0, 1.0))
    b = one_pass({(2, 2): 3.0}, (6.0, 0.0, 0.5))
    m = merge_passes([a, b]).apps["mlr"]
    fitted = EpochTimeModel(tuple(m.theta))
    for w, s in shapes:
        assert fitted.epoch_time(w, s) == pytest.approx(truth.epoch_time(w, s), rel=1e-3)
    assert (m.am_start_s, m.startup_s, m.finish_s) == (6.0, 0.0, 0.5)     # the cheaper pass (6.5 s < 7 s)
    assert msgspec.json.decode(msgspec.json.encode(m), type=AppCalibration) == m


def test_eight_distinct_shapes_per_app_that_fit_the_calibration_cluster() -> None:
    from elastane_cli.sim_calibrate import AM_MEMORY_MB, EXECUTOR_MEMORY_MB, SHAPES, ClusterShape
    cs = ClusterShape()
    assert len(set(SHAPES)) == len(SHAPES) >= 8
    assert len({w for w, _ in SHAPES}) >= 3 and len({s for _, s in SHAPES}) >= 3   # both roles vary
    for w, s in SHAPES:
        assert w + s + 1 <= cs.nodes * cs.node_vcores                                # AM included
        assert (w + s) * EXECUTOR_MEMORY_MB + AM_MEMORY_MB <= cs.nodes * cs.node_memory_mb


def test_the_shipped_calibration_was_fitted_on_eight_shapes_per_app() -> None:
    from sim.calibration import load
    cal = load()
    assert set(cal.apps) == {"mlr", "nmf", "lda", "lasso"}
    for name, app in cal.apps.items():
        assert len({(int(w), int(s)) for w, s, _ in app.samples}) >= 8, name


@pytest.mark.parametrize("bad", ["2", "0x1", "1x", "ax2", ","])
def test_calibrate_refuses_bad_shapes(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    from elastane_cli.main import main
    assert main(["sim", "calibrate", "--shapes", bad, "-o", "/nonexistent/x.json"]) == 2
    assert "--shapes" in capsys.readouterr().err
