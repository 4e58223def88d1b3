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
"""
from __future__ import annotations

import enum

from protocol.state_machine import TransitionTable


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


class HarmonyStateError(RuntimeError):
    """An event the job's Harmony state does not allow (a policy bug)."""

    def __init__(self, state: JobState, event: JobEvent):
        super().__init__(f"harmony: {event.value} is not allowed for a {state.value} job")
        self.state = state
        self.event = event


_S, _E = JobState, JobEvent
TRANSITIONS: TransitionTable[JobState, JobEvent, JobState] = TransitionTable({
    (_S.WAITING, _E.PROFILE): _S.PROFILING,
    (_S.PROFILING, _E.REQUEUE): _S.WAITING,
    (_S.PROFILING, _E.MEASURED): _S.PROFILED,
    (_S.PROFILED, _E.RUN): _S.RUNNING,
    (_S.PROFILED, _E.PAUSE): _S.PAUSED,
    (_S.RUNNING, _E.MOVE): _S.RUNNING,
    (_S.RUNNING, _E.PAUSE): _S.PAUSED,
    (_S.PAUSED, _E.RESUME): _S.RUNNING,
    **{(s, _E.FINISH): _S.FINISHED for s in JobState if s is not _S.FINISHED},
}, HarmonyStateError)


def advance(state: JobState, event: JobEvent) -> JobState:
    """The state after `event`; HarmonyStateError if the table does not allow it."""
    return TRANSITIONS.next(state, event)


__all__ = ["HarmonyStateError", "JobEvent", "JobState", "TRANSITIONS", "advance"]
