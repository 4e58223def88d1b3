"""Application and attempt lifecycles as explicit, pure transition tables (YARN's RMApp / RMAppAttempt).

No I/O here: the core applies events and the tables say what state follows, or raise.
"""
from __future__ import annotations

import enum

from protocol.records import AppState, AttemptState, ExitStatus
from protocol.state_machine import InvalidTransition, TransitionTable



def _invalid(machine: str, state: enum.Enum, event: enum.Enum) -> InvalidTransition:
    return InvalidTransition(f"{machine}: event {event.value} is invalid in state {state.value}", state, event)


class AppEvent(str, enum.Enum):
    START = "START"                        # submission validated; being saved
    SAVED = "SAVED"                        # the state store has it
    ACCEPT = "ACCEPT"                      # the scheduler took it; first attempt created
    RECOVER = "RECOVER"                    # restored from the state store after an RM restart
    ATTEMPT_REGISTERED = "ATTEMPT_REGISTERED"
    ATTEMPT_FINISHED = "ATTEMPT_FINISHED"  # AM unregistered with SUCCEEDED/FAILED/KILLED final status
    ATTEMPT_RETRY = "ATTEMPT_RETRY"        # an attempt failed, another one is made
    ATTEMPT_FAILED = "ATTEMPT_FAILED"      # an attempt failed and none are left
    KILL = "KILL"


_S, _E = AppState, AppEvent
APP_TRANSITIONS: TransitionTable[AppState, AppEvent, AppState] = TransitionTable({
    (_S.NEW, _E.START): _S.NEW_SAVING,
    (_S.NEW, _E.RECOVER): _S.ACCEPTED,
    (_S.NEW_SAVING, _E.SAVED): _S.SUBMITTED,
    (_S.SUBMITTED, _E.ACCEPT): _S.ACCEPTED,
    (_S.ACCEPTED, _E.ATTEMPT_REGISTERED): _S.RUNNING,
    (_S.ACCEPTED, _E.ATTEMPT_RETRY): _S.ACCEPTED,
    (_S.ACCEPTED, _E.ATTEMPT_FAILED): _S.FAILED,
    (_S.RUNNING, _E.ATTEMPT_FINISHED): _S.FINISHED,
    (_S.RUNNING, _E.ATTEMPT_RETRY): _S.ACCEPTED,
    (_S.RUNNING, _E.ATTEMPT_FAILED): _S.FAILED,
}, lambda state, event: _invalid("application", state, event))
for _st in (_S.NEW, _S.NEW_SAVING, _S.SUBMITTED, _S.ACCEPTED, _S.RUNNING):
    APP_TRANSITIONS[(_st, _E.KILL)] = _S.KILLED


class AttemptEvent(str, enum.Enum):
    START = "START"
    SCHEDULE = "SCHEDULE"                  # AM container asked of the scheduler
    ALLOCATED = "ALLOCATED"                # AM container allocated
    LAUNCHED = "LAUNCHED"                  # the NM started the AM container
    REGISTERED = "REGISTERED"              # the AM called /am/register
    UNREGISTERED = "UNREGISTERED"          # the AM called /am/finish
    CONTAINER_FINISHED = "CONTAINER_FINISHED"  # AM container exited after unregistering
    FAIL = "FAIL"
    KILL = "KILL"


_A, _AE = AttemptState, AttemptEvent
ATTEMPT_TRANSITIONS: TransitionTable[AttemptState, AttemptEvent, AttemptState] = TransitionTable({
    (_A.NEW, _AE.START): _A.SUBMITTED,
    (_A.SUBMITTED, _AE.SCHEDULE): _A.SCHEDULED,
    (_A.SCHEDULED, _AE.ALLOCATED): _A.ALLOCATED,
    (_A.ALLOCATED, _AE.LAUNCHED): _A.LAUNCHED,
    # The AM may register before the launcher has heard back from the NM.
    (_A.ALLOCATED, _AE.REGISTERED): _A.RUNNING,
    (_A.LAUNCHED, _AE.REGISTERED): _A.RUNNING,
    (_A.RUNNING, _AE.LAUNCHED): _A.RUNNING,
    (_A.RUNNING, _AE.UNREGISTERED): _A.FINISHING,
    (_A.FINISHING, _AE.CONTAINER_FINISHED): _A.FINISHED,
}, lambda state, event: _invalid("application attempt", state, event))
for _at in (_A.NEW, _A.SUBMITTED, _A.SCHEDULED, _A.ALLOCATED, _A.LAUNCHED, _A.RUNNING):
    ATTEMPT_TRANSITIONS[(_at, _AE.FAIL)] = _A.FAILED
    ATTEMPT_TRANSITIONS[(_at, _AE.KILL)] = _A.KILLED
# A FINISHING attempt whose app is killed (or whose AM container never exits) just finishes.
ATTEMPT_TRANSITIONS[(_A.FINISHING, _AE.KILL)] = _A.FINISHED
ATTEMPT_TRANSITIONS[(_A.FINISHING, _AE.FAIL)] = _A.FINISHED

ATTEMPT_FINAL = frozenset({_A.FINISHED, _A.FAILED, _A.KILLED})


def next_app_state(state: AppState, event: AppEvent) -> AppState:
    """The state after `event`, or InvalidTransition."""
    return APP_TRANSITIONS.next(state, event)


def next_attempt_state(state: AttemptState, event: AttemptEvent) -> AttemptState:
    """The state after `event`, or InvalidTransition."""
    return ATTEMPT_TRANSITIONS.next(state, event)


def attempt_is_final(state: AttemptState) -> bool:
    return state in ATTEMPT_FINAL


# AM container exits the platform caused, not the AM: YARN's
# RMAppAttemptImpl.shouldCountTowardsMaxAttemptRetry leaves these attempts out of max-app-attempts.
NOT_COUNTED = " (not counted toward the application's max-app-attempts)"   # appended to diagnostics
NOT_COUNTED_AM_EXITS = frozenset({ExitStatus.ABORTED, ExitStatus.PREEMPTED, ExitStatus.DISKS_FAILED,
                                  ExitStatus.KILLED_BY_RESOURCEMANAGER})


def counts_toward_max_attempts(am_exit_status: int) -> bool:
    """Whether a FAILED attempt whose AM container ended with `am_exit_status` uses up one of the
    app's attempts (ExitStatus.INVALID: the AM container never reported, e.g. an AM expiry or a
    launch failure, which counts as in YARN)."""
    return am_exit_status not in NOT_COUNTED_AM_EXITS
