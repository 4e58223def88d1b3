"""A job's life under the `harmony` policy, as a pure transition table (dissertation §4.2):

    waiting --profile--> profiling --measured--> profiled --run--> running <--resume-- paused
                             |                       |                |  \\--pause--^      ^
                             '--requeue--> waiting    '------pause-----+--------------------'
                                                               running --move--> running (migrated)

* waiting: submitted, not yet given a node to be profiled on (its executors are held back).
* profiling: it runs alone on one node until its report has COMP/COMM timings.
* profiled: it has a profile and still runs on its profiling node until the scheduler puts it in
  a group (run) or makes it wait (pause).
* running: in a group, its executors on every node of the group; `move` = regrouped onto another
  group's nodes (migration).
* paused: checkpointed, executors released; `resume` puts it back in a group.
* finished: the app ended (any state). A profiling job whose node is lost goes back to waiting.

The table also decides the run state the policy tells the job's AM (RUN, PAUSE or RESUME): each
entry is (next state, run state), where KEEP leaves the current run state -- a moved job keeps
RESUME until it is running, a requeued or measured one keeps RUN. `step` is the one place a job's
run state changes.
"""
from __future__ import annotations

import enum
from typing import Optional

from protocol.internal_api import RunState
from protocol.state_machine import TransitionTable
from protocol.errors import StateError


class JobState(str, enum.Enum):
    WAITING = "waiting"
    PROFILING = "profiling"
    PROFILED = "profiled"
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"


class JobEvent(str, enum.Enum):
    PROFILE = "profile"         # given a node to be profiled on
    REQUEUE = "requeue"         # its profiling node was lost
    MEASURED = "measured"       # its report has timings
    RUN = "run"                 # put in a group
    MOVE = "move"               # regrouped: to another group or other nodes
    PAUSE = "pause"
    RESUME = "resume"
    FINISH = "finish"


class HarmonyStateError(StateError, RuntimeError):
    """An event the job's Harmony state does not allow (a policy bug)."""

    def __init__(self, state: JobState, event: JobEvent):
        super().__init__(f"harmony: {event.value} is not allowed for a {state.value} job")
        self.state = state
        self.event = event


_S, _E, _R = JobState, JobEvent, RunState
KEEP: Optional[RunState] = None     # the entry leaves the job's run state as it is
TRANSITIONS: TransitionTable[JobState, JobEvent, tuple[JobState, Optional[RunState]]] = TransitionTable({
    (_S.WAITING, _E.PROFILE): (_S.PROFILING, _R.RUN),
    (_S.PROFILING, _E.REQUEUE): (_S.WAITING, KEEP),
    (_S.PROFILING, _E.MEASURED): (_S.PROFILED, KEEP),
    (_S.PROFILED, _E.RUN): (_S.RUNNING, _R.RUN),
    (_S.PROFILED, _E.PAUSE): (_S.PAUSED, _R.PAUSE),
    # A move keeps a resuming job's RESUME (its AM has not restored the checkpoint yet) and a
    # running one's RUN: a running job's run state is never PAUSE.
    (_S.RUNNING, _E.MOVE): (_S.RUNNING, KEEP),
    (_S.RUNNING, _E.PAUSE): (_S.PAUSED, _R.PAUSE),
    (_S.PAUSED, _E.RESUME): (_S.RUNNING, _R.RESUME),
    **{(s, _E.FINISH): (_S.FINISHED, KEEP) for s in JobState if s is not _S.FINISHED},
}, HarmonyStateError)


def step(state: JobState, run_state: RunState, event: JobEvent) -> tuple[JobState, RunState]:
    """(job state, run state) after `event`; HarmonyStateError if the table does not allow it."""
    after, run = TRANSITIONS.next(state, event)
    return after, run_state if run is None else run


def advance(state: JobState, event: JobEvent) -> JobState:
    """The job state after `event` (its run state aside); HarmonyStateError if not allowed."""
    return TRANSITIONS.next(state, event)[0]


__all__ = ["HarmonyStateError", "JobEvent", "JobState", "KEEP", "TRANSITIONS", "advance", "step"]
