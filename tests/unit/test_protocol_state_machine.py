"""The shared transition table: lookups, the machine's own error, and the modules built on it."""
from __future__ import annotations

import enum

import pytest

from protocol.state_machine import TransitionTable


class Light(enum.Enum):
    RED = "red"
    GREEN = "green"


class Ev(enum.Enum):
    GO = "go"
    STOP = "stop"


class LightError(ValueError):
    pass


TABLE: TransitionTable[Light, Ev, Light] = TransitionTable(
    {(Light.RED, Ev.GO): Light.GREEN, (Light.GREEN, Ev.STOP): Light.RED},
    lambda s, e: LightError(f"{e.value} not allowed in {s.value}"))


def test_next_follows_the_table_and_raises_the_machines_own_error() -> None:
    assert TABLE.next(Light.RED, Ev.GO) is Light.GREEN
    assert TABLE.allows(Light.GREEN, Ev.STOP) and not TABLE.allows(Light.GREEN, Ev.GO)
    with pytest.raises(LightError, match="go not allowed in green"):
        TABLE.next(Light.GREEN, Ev.GO)


def test_it_is_a_dict_that_can_be_extended_while_a_module_is_built() -> None:
    t = TransitionTable(dict(TABLE), lambda s, e: LightError("no"))
    t[(Light.RED, Ev.STOP)] = Light.RED
    assert t.next(Light.RED, Ev.STOP) is Light.RED and len(t) == 3 and len(TABLE) == 2


def test_every_machine_of_the_project_uses_it_and_keeps_its_error() -> None:
    from appmaster.container_book import TRANSITIONS as am_containers, AmContainerState, ContainerEvent, TransitionError
    from nodemanager.container_state import TRANSITIONS as nm_containers
    from psruntime.store.migration import TRANSITIONS as migration
    from rm.policies.eps_trial import TRANSITIONS as trials
    from rm.state_machines import APP_TRANSITIONS, ATTEMPT_TRANSITIONS
    from appmaster.cruise.plan import OP_TRANSITIONS
    from appmaster.ps.runtime.executor_pool import EXECUTOR_TRANSITIONS
    from rm.policies.harmony_lifecycle import TRANSITIONS as harmony_jobs
    from appmaster.ps.controller import LIFECYCLE      # the PS job's lifecycle, which the simulator runs too
    for table in (am_containers, nm_containers, migration, trials, APP_TRANSITIONS,
                  ATTEMPT_TRANSITIONS, OP_TRANSITIONS, EXECUTOR_TRANSITIONS, harmony_jobs, LIFECYCLE):
        assert isinstance(table, TransitionTable) and len(table) > 0
    with pytest.raises(TransitionError, match="LAUNCH not allowed in state COMPLETED"):
        am_containers.next(AmContainerState.COMPLETED, ContainerEvent.LAUNCH)
