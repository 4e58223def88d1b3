"""elastane_cli/machine_load.py: the machine's busy share and load over a measurement, and refusal."""
from __future__ import annotations

import pytest

from elastane_cli.machine_load import MachineLoad, MachineMeter, SaturationLimits, cpu_seconds


def test_a_quiet_machine_is_accepted_and_a_saturated_one_refused_with_the_reason() -> None:
    limits = SaturationLimits(busy_share=0.9, load_per_core=1.0)
    assert limits.refuse(MachineLoad(0.5, 0.4, 2)) is None
    assert limits.refuse(MachineLoad(0.9, 1.0, 2)) is None                   # at the limits: accepted
    busy = limits.refuse(MachineLoad(0.95, 0.4, 2))
    assert busy is not None and "95% busy" in busy and "load" not in busy
    loaded = limits.refuse(MachineLoad(0.5, 8.0, 2))
    assert loaded is not None and "load 8.00 per core" in loaded
    both = limits.refuse(MachineLoad(1.0, 12.0, 2))
    assert both is not None and "busy" in both and "load" in both


def test_the_meter_measures_between_its_readings() -> None:
    cpu = iter([(100.0, 400.0), (130.0, 440.0)])      # 30 of 40 CPU-seconds busy
    loads = iter([1.0, 3.0])
    m = MachineMeter(read_cpu=lambda: next(cpu), read_load=lambda: next(loads), cores=2).start()
    got = m.stop()
    assert got.busy_share == pytest.approx(0.75)
    assert got.load_per_core == pytest.approx(1.0)       # mean of 1 and 3, over 2 cores
    with pytest.raises(RuntimeError):
        m.stop()                                          # each measurement starts again


def test_the_real_counters_move_forward() -> None:
    busy, total = cpu_seconds()
    assert 0 <= busy <= total
    load = MachineMeter().start().stop()
    assert 0.0 <= load.busy_share <= 1.0 and load.load_per_core >= 0.0


@pytest.mark.parametrize("busy, load", [(0.0, 1.0), (1.5, 1.0), (0.9, 0.0)])
def test_limits_out_of_range_are_refused(busy: float, load: float) -> None:
    with pytest.raises(ValueError):
        SaturationLimits(busy_share=busy, load_per_core=load)


def test_on_budgeted_hosts_only_the_busy_share_refuses_and_the_load_is_kept() -> None:
    """Tasks waiting on their host's CPU budget are runnable: 3.4 per core at 41 % busy was a
    calibration run of 18 executors on budgeted hosts, not a saturated machine."""
    limits = SaturationLimits.budgeted_hosts()
    assert limits.refuse(MachineLoad(busy_share=0.41, load_per_core=3.4, cores=2)) is None
    assert "machine 95% busy" in (limits.refuse(MachineLoad(busy_share=0.95, load_per_core=0.2, cores=2)) or "")
    assert SaturationLimits().refuse(MachineLoad(busy_share=0.41, load_per_core=3.4, cores=2)) is not None
    assert limits.describe() == "above 90% busy" and SaturationLimits().describe() == "above 90% busy or 1 load per core"
