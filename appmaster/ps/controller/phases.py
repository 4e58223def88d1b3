"""The PS job's lifecycle: every phase a job really goes through, on one TransitionTable.

    STARTING -REGISTERED-> LAUNCHING_SERVERS -SERVERS_READY-> LAUNCHING_WORKERS -WORKERS_READY->
        INITIALISING -INITIALISED-> TRAINING                   (a first attempt: a fresh model)
        RESTORING    -INITIALISED-> TRAINING                   (WORKERS_READY_RESUME: a new AM
                                                                attempt back on its checkpoint)
    STARTING -ADOPT-> ADOPTING -INITIALISED-> TRAINING         a new AM attempt takes over the
                               -ADOPT_FAILED-> LAUNCHING_SERVERS  failed one's executors (else it
                                                                starts new ones, as above)
    TRAINING -RESHAPE-> RESHAPING          EPS add / remove / place / relocate, live
             -RESTART-> RESTARTING         the kill-based baseline: checkpoint, stop all, restart
             -PLAN-> EXECUTING_PLAN        a Cruise plan, op by op
             -CHECKPOINT-> CHECKPOINTING   a checkpoint at an epoch boundary (due or asked for)
             -MIGRATE-> MIGRATING          the whole job to another placement / executor size
                                           through a checkpoint (Harmony's move, a resize)
             -RECOVER-> RECOVERING         an executor lost (or a straggler replaced)
             -PAUSE-> PAUSING -PAUSED-> PAUSED -RESUME-> RESUMING    Harmony's suspension
    every change phase -CHANGE_DONE-> TRAINING (RESUMING too); a change that fails ends the same way
    TRAINING -TRAINED-> FINISHING -FINISHED-> SUCCEEDED
    FAIL -> FAILED and STOP -> KILLED from every phase that is not final.

The change phases are where today's Reconfiguration lock, busy flags and hooks were: the phase
*is* the one change slot, and `rules.RULES` says what an event arriving in it does.
"""
from __future__ import annotations

import enum

from protocol.state_machine import InvalidTransition, TransitionTable


class Phase(str, enum.Enum):
    """Where a PS job is (the AM's `/status` state and its job report's phase)."""

    STARTING = "STARTING"
    LAUNCHING_SERVERS = "LAUNCHING_SERVERS"
    LAUNCHING_WORKERS = "LAUNCHING_WORKERS"
    INITIALISING = "INITIALISING"
    RESTORING = "RESTORING"
    ADOPTING = "ADOPTING"
    TRAINING = "TRAINING"
    RESHAPING = "RESHAPING"
    RESTARTING = "RESTARTING"
    EXECUTING_PLAN = "EXECUTING_PLAN"
    CHECKPOINTING = "CHECKPOINTING"
    MIGRATING = "MIGRATING"
    RECOVERING = "RECOVERING"
    PAUSING = "PAUSING"
    PAUSED = "PAUSED"
    RESUMING = "RESUMING"
    FINISHING = "FINISHING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def is_final(self) -> bool:
        return self in FINAL

    @property
    def trains(self) -> bool:
        """Whether training runs (or is between two of its clocks) in this phase: the live
        changes run beside it; a restart, a migration and a pause stop it."""
        return self in TRAINS

    @property
    def changing(self) -> bool:
        """Whether a change of the job's shape or state holds the job's one change slot."""
        return self in CHANGE_PHASES

    @property
    def executors_expected_alive(self) -> bool:
        """Whether an executor ending now, not retired on purpose, is a loss."""
        return self not in (Phase.STARTING, Phase.PAUSED) and not self.is_final


class Trigger(str, enum.Enum):
    """What moves the job from phase to phase (the controller fires them; module doc)."""

    REGISTERED = "REGISTERED"
    ADOPT = "ADOPT"
    ADOPT_FAILED = "ADOPT_FAILED"
    SERVERS_READY = "SERVERS_READY"
    WORKERS_READY = "WORKERS_READY"
    WORKERS_READY_RESUME = "WORKERS_READY_RESUME"
    INITIALISED = "INITIALISED"
    RESHAPE = "RESHAPE"
    RESTART = "RESTART"
    PLAN = "PLAN"
    CHECKPOINT = "CHECKPOINT"
    MIGRATE = "MIGRATE"
    RECOVER = "RECOVER"
    PAUSE = "PAUSE"
    PAUSED = "PAUSED"
    RESUME = "RESUME"
    CHANGE_DONE = "CHANGE_DONE"
    TRAINED = "TRAINED"
    FINISHED = "FINISHED"
    FAIL = "FAIL"
    STOP = "STOP"


FINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.KILLED})
# A change started from TRAINING, by the trigger that starts it.
CHANGE_STARTS: dict[Trigger, Phase] = {
    Trigger.RESHAPE: Phase.RESHAPING, Trigger.RESTART: Phase.RESTARTING, Trigger.PLAN: Phase.EXECUTING_PLAN,
    Trigger.CHECKPOINT: Phase.CHECKPOINTING, Trigger.MIGRATE: Phase.MIGRATING, Trigger.RECOVER: Phase.RECOVERING,
    Trigger.PAUSE: Phase.PAUSING,
}
CHANGE_PHASES = frozenset(CHANGE_STARTS.values()) | {Phase.PAUSED, Phase.RESUMING}
TRAINS = frozenset({Phase.TRAINING, Phase.RESHAPING, Phase.EXECUTING_PLAN, Phase.CHECKPOINTING,
                    Phase.RECOVERING, Phase.PAUSING})


class JobTransitionError(InvalidTransition):
    """A trigger the job's current phase does not take."""

    def __init__(self, phase: Phase, trigger: Trigger) -> None:
        super().__init__(f"{trigger.value} is not allowed in phase {phase.value}", phase, trigger)
        self.phase = phase
        self.trigger = trigger


_P, _T = Phase, Trigger
LIFECYCLE: TransitionTable[Phase, Trigger, Phase] = TransitionTable({
    (_P.STARTING, _T.REGISTERED): _P.LAUNCHING_SERVERS,
    (_P.STARTING, _T.ADOPT): _P.ADOPTING,
    (_P.ADOPTING, _T.INITIALISED): _P.TRAINING,
    (_P.ADOPTING, _T.ADOPT_FAILED): _P.LAUNCHING_SERVERS,
    (_P.LAUNCHING_SERVERS, _T.SERVERS_READY): _P.LAUNCHING_WORKERS,
    (_P.LAUNCHING_WORKERS, _T.WORKERS_READY): _P.INITIALISING,
    (_P.LAUNCHING_WORKERS, _T.WORKERS_READY_RESUME): _P.RESTORING,
    (_P.INITIALISING, _T.INITIALISED): _P.TRAINING,
    (_P.RESTORING, _T.INITIALISED): _P.TRAINING,
    **{(_P.TRAINING, trigger): phase for trigger, phase in CHANGE_STARTS.items()},
    **{(phase, _T.CHANGE_DONE): _P.TRAINING for phase in CHANGE_STARTS.values() if phase is not _P.PAUSING},
    (_P.PAUSING, _T.PAUSED): _P.PAUSED,
    (_P.PAUSING, _T.CHANGE_DONE): _P.TRAINING,      # the pause failed: training goes on
    (_P.PAUSED, _T.RESUME): _P.RESUMING,
    (_P.RESUMING, _T.CHANGE_DONE): _P.TRAINING,
    (_P.RESUMING, _T.PAUSED): _P.PAUSED,           # its executors did not come: still paused
    (_P.TRAINING, _T.TRAINED): _P.FINISHING,
    (_P.FINISHING, _T.FINISHED): _P.SUCCEEDED,
    **{(p, _T.FAIL): _P.FAILED for p in Phase if p not in FINAL},
    **{(p, _T.STOP): _P.KILLED for p in Phase if p not in FINAL},
}, JobTransitionError)
