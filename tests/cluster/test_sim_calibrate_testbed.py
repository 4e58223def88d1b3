"""`elastane sim calibrate` on the multi-host testbed, end to end at its smallest (one app, two
shapes, three repeats of two epochs): every sample carries the machine's state, a saturated
machine's samples are refused and fit nothing, accepted ones give the app's coefficients with their
spread and measured range."""
from __future__ import annotations

from pathlib import Path

import pytest

from elastane_cli import testbed_hosts
from elastane_cli.machine_load import SaturationLimits
from elastane_cli.sim_calibrate import calibrate
from sim.calibration import load

_reason = testbed_hosts.unavailable_reason(sshd=True)
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(_reason is not None, reason=f"no multi-host testbed here: {_reason}")]

SHAPES = ((1, 1), (2, 1))


@pytest.mark.timeout(1500)
def test_accepted_samples_are_fitted_with_their_spread_and_range(tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    logs: list[str] = []
    # limits no machine reaches: every run is accepted, whatever else this machine runs
    calibrate(out, ["mlr"], shapes=SHAPES, epochs=2, repeats=3, log=logs.append,
              limits=SaturationLimits(busy_share=1.0, load_per_core=1e6))
    cal = load(out)
    app = cal.app("mlr")
    assert len(app.shape_samples) == 6 and all(s.accepted for s in app.shape_samples)
    assert all(s.busy_share is not None and s.load_per_core is not None for s in app.shape_samples)
    assert sorted((int(w), int(s)) for w, s, _ in app.samples) == list(SHAPES)
    assert [sp[2] for sp in app.shape_spread] == [3, 3]
    assert app.measured_range() == (2, 1)
    assert 0 < cal.core_per_vcore <= 1.0 and "repeats" in cal.note
    assert cal.pinned_hosts and "pinned" in cal.measured_on     # hosts pinned to CPUs, recorded
    assert any("plan:" in line for line in logs)


@pytest.mark.timeout(900)
def test_a_saturated_machines_samples_are_refused_and_fit_nothing(tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    logs: list[str] = []
    # a limit every run exceeds (the hosts' own work keeps the machine more than 0.1 % busy)
    with pytest.raises(RuntimeError, match="3 of 3 samples refused"):
        calibrate(out, ["mlr"], shapes=SHAPES[:1], epochs=2, repeats=3, log=logs.append,
                  limits=SaturationLimits(busy_share=0.001, load_per_core=1e6))
    assert not out.exists()
    assert sum("REFUSED" in line for line in logs) == 3
