"""Pinned testbed hosts (elastane_cli/testbed_hosts.py `pin_assignment`): each capped host gets the
machine CPUs its budget needs, in turn; the master floats; budgets that would overload a CPU are
refused; what runs on a pinned host enters it through taskset."""
from __future__ import annotations

import pytest

from elastane_cli.testbed_hosts import Host, TestbedError, pin_assignment


def test_capped_hosts_take_one_cpu_each_in_turn_and_the_uncapped_master_floats() -> None:
    assert pin_assignment([None, 0.375, 0.375, 0.375, 0.375], machine_cpus=[0, 1]) == [None, "0", "1", "0", "1"]
    assert pin_assignment([0.3, 0.3, 0.3], machine_cpus=[2, 5, 7]) == ["2", "5", "7"]


def test_a_budget_above_a_core_gets_as_many_cpus_as_it_needs() -> None:
    assert pin_assignment([None, 3.0, 3.0, 2.5, 1.0], machine_cpus=list(range(16))) == \
        [None, "0,1,2", "3,4,5", "6,7,8", "9"]


def test_budgets_that_overload_a_cpu_are_refused_naming_it() -> None:
    with pytest.raises(TestbedError, match=r"cores asked of each: \{0: 1.2"):
        pin_assignment([0.6, 0.6, 0.6], machine_cpus=[0, 1])
    # the same budgets fit three CPUs
    assert pin_assignment([0.6, 0.6, 0.6], machine_cpus=[0, 1, 2]) == ["0", "1", "2"]


def test_what_enters_a_pinned_host_goes_through_taskset_and_an_unpinned_one_does_not() -> None:
    pinned = Host(index=1, name="node1", ip="10.0.0.11", namespace="ns", veth="v", dir="/x", cpus=0.3,
                  anchor_pid=42, cpu_list="1")
    cmd = pinned.exec_prefix()
    assert cmd[cmd.index("--") + 1:cmd.index("nsenter")] == ["taskset", "-c", "1"]
    free = Host(index=0, name="master", ip="10.0.0.10", namespace="ns", veth="v", dir="/x", anchor_pid=41)
    assert "taskset" not in free.exec_prefix()
    assert Host.from_json(pinned.to_json()) == pinned
