"""The PS job's lifecycle as a pure state machine (no I/O): phases, events and the transition table.

    STARTING -REGISTERED-> LAUNCHING_SERVERS -SERVERS_READY-> LAUNCHING_WORKERS -WORKERS_READY->
    INITIALISING -INITIALISED-> TRAINING -TRAINED-> FINISHING -FINISHED-> SUCCEEDED

FAIL (an executor died, a step failed) leads to FAILED and STOP (SIGTERM, the RM's shutdown) to
KILLED from any phase that is not final.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from protocol.state_machine import TransitionTable
from protocol.errors import StateError


class JobPhase(str, enum.Enum):
    """Where the PS job is."""

    STARTING = "STARTING"
    LAUNCHING_SERVERS = "LAUNCHING_SERVERS"
    LAUNCHING_WORKERS = "LAUNCHING_WORKERS"
    INITIALISING = "INITIALISING"
    TRAINING = "TRAINING"
    FINISHING = "FINISHING"          # final checkpoint and evaluation
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def is_final(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.KILLED)

    @property
    def executors_expected_alive(self) -> bool:
        """Whether an executor ending now is a failure (rather than part of shutting down)."""
        return self in (JobPhase.LAUNCHING_SERVERS, JobPhase.LAUNCHING_WORKERS, JobPhase.INITIALISING,
                        JobPhase.TRAINING, JobPhase.FINISHING)


class JobEvent(str, enum.Enum):
    REGISTERED = "REGISTERED"
    SERVERS_READY = "SERVERS_READY"
    WORKERS_READY = "WORKERS_READY"
    INITIALISED = "INITIALISED"
    TRAINED = "TRAINED"
    FINISHED = "FINISHED"
    FAIL = "FAIL"
    STOP = "STOP"


_FORWARD: dict[tuple[JobPhase, JobEvent], JobPhase] = {
    (JobPhase.STARTING, JobEvent.REGISTERED): JobPhase.LAUNCHING_SERVERS,
    (JobPhase.LAUNCHING_SERVERS, JobEvent.SERVERS_READY): JobPhase.LAUNCHING_WORKERS,
    (JobPhase.LAUNCHING_WORKERS, JobEvent.WORKERS_READY): JobPhase.INITIALISING,
    (JobPhase.INITIALISING, JobEvent.INITIALISED): JobPhase.TRAINING,
    (JobPhase.TRAINING, JobEvent.TRAINED): JobPhase.FINISHING,
    (JobPhase.FINISHING, JobEvent.FINISHED): JobPhase.SUCCEEDED,
}
TRANSITIONS: TransitionTable[JobPhase, JobEvent, JobPhase] = TransitionTable({
    **_FORWARD,
    **{(p, JobEvent.FAIL): JobPhase.FAILED for p in JobPhase if not p.is_final},
    **{(p, JobEvent.STOP): JobPhase.KILLED for p in JobPhase if not p.is_final},
}, lambda phase, event: JobTransitionError(f"event {event.value} is not allowed in phase {phase.value}"))


class JobTransitionError(StateError, RuntimeError):
    """An event that is not allowed in the job's current phase."""


@dataclass
class JobStateMachine:
    """The job's phase and why it ended; `apply` follows TRANSITIONS or raises."""

    phase: JobPhase = JobPhase.STARTING
    diagnostics: str = ""
    history: list[tuple[JobPhase, JobEvent, JobPhase]] = field(default_factory=list)

    def apply(self, event: JobEvent, diagnostics: str = "") -> JobPhase:
        nxt = TRANSITIONS.next(self.phase, event)
        self.history.append((self.phase, event, nxt))
        self.phase = nxt
        if diagnostics:
            self.diagnostics = diagnostics
        return nxt

    def try_apply(self, event: JobEvent, diagnostics: str = "") -> bool:
        """Apply `event` if allowed (e.g. a second failure after the first); returns whether it was."""
        if not TRANSITIONS.allows(self.phase, event):
            return False
        self.apply(event, diagnostics)
        return True
