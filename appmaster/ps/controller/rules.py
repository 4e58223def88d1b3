"""The written rule for an event that arrives while the job's one change slot is taken.

Which change holds the slot (state.ChangeKind; IDLE: none, the job training) x what arrives ->
what the controller does. This table replaces what the AM's reconfiguration lock, busy / changing
flags and after-construction hooks did implicitly:

    START    the request starts a change now
    KEEP     it waits for the slot (the newest directive supersedes older kept ones; endpoint
             checkpoint requests are served at the next epoch end once the slot is free)
    REJECT   409 Conflict, nothing changes (a /scale while another change runs: EPS's ElasticBusy)
    ABORT    the running change's steps are cancelled; it rolls back what it did, ends FAILED,
             then the arrival is handled (a loss during an EPS change, a plan or a restart)
    MERGE    the running change takes it in (a second loss during a recovery: one recovery)
    IGNORE   dropped (a Cruise proposal while a change runs: it re-plans at the next epoch)
    FAIL     the job fails, naming it (a user-code error anywhere; a loss the job cannot survive)
"""
from __future__ import annotations

import enum
from typing import Optional

from .state import ChangeKind


class Arrival(str, enum.Enum):
    """What can arrive while a change may be running."""

    DIRECTIVE = "directive"
    SCALE = "scale"
    CHECKPOINT = "checkpoint"
    PLAN = "plan"
    LOSS = "loss"
    STRAGGLER = "straggler"
    USER_ERROR = "user_error"


class Rule(str, enum.Enum):
    START = "START"
    KEEP = "KEEP"
    REJECT = "REJECT"
    ABORT = "ABORT"
    MERGE = "MERGE"
    IGNORE = "IGNORE"
    FAIL = "FAIL"


IDLE: Optional[ChangeKind] = None
_K, _A, _R = ChangeKind, Arrival, Rule
_LIVE = (_K.EPS, _K.PLAN, _K.CHECKPOINT, _K.STRAGGLER)
_STOPPED = (_K.RESTART, _K.MIGRATE, _K.RESUME)

RULES: dict[tuple[Optional[ChangeKind], Arrival], Rule] = {
    # Training, nothing changing: everything starts at once (a checkpoint request at the next
    # epoch end, which is where the job is consistent between clocks and epochs).
    **{(IDLE, a): r for a, r in {_A.DIRECTIVE: _R.START, _A.SCALE: _R.START, _A.CHECKPOINT: _R.KEEP,
                                 _A.PLAN: _R.START, _A.LOSS: _R.START, _A.STRAGGLER: _R.START,
                                 _A.USER_ERROR: _R.FAIL}.items()},
    # The first executors and the set-up: the job has no shape to change or model to save yet.
    **{(_K.START, a): r for a, r in {_A.DIRECTIVE: _R.KEEP, _A.SCALE: _R.REJECT, _A.CHECKPOINT: _R.REJECT,
                                     _A.PLAN: _R.IGNORE, _A.LOSS: _R.FAIL, _A.STRAGGLER: _R.IGNORE,
                                     _A.USER_ERROR: _R.FAIL}.items()},
    # Live changes (training runs beside them): a loss aborts the change, whose steps fail once
    # training stops anyway, then the recovery runs.
    **{(k, a): r for k in _LIVE
       for a, r in {_A.DIRECTIVE: _R.KEEP, _A.SCALE: _R.REJECT, _A.CHECKPOINT: _R.KEEP, _A.PLAN: _R.IGNORE,
                    _A.LOSS: _R.ABORT, _A.STRAGGLER: _R.IGNORE, _A.USER_ERROR: _R.FAIL}.items()},
    # Changes that stop training and start executors afresh: a loss among the new ones aborts the
    # change (rolled back to its checkpoint), then the recovery starts the job again.
    **{(k, a): r for k in _STOPPED
       for a, r in {_A.DIRECTIVE: _R.KEEP, _A.SCALE: _R.REJECT, _A.CHECKPOINT: _R.KEEP, _A.PLAN: _R.IGNORE,
                    _A.LOSS: _R.ABORT, _A.STRAGGLER: _R.IGNORE, _A.USER_ERROR: _R.FAIL}.items()},
    # A recovery takes further losses in (a lost node's executors are one event).
    **{(_K.RECOVER, a): r for a, r in {_A.DIRECTIVE: _R.KEEP, _A.SCALE: _R.REJECT, _A.CHECKPOINT: _R.KEEP,
                                       _A.PLAN: _R.IGNORE, _A.LOSS: _R.MERGE, _A.STRAGGLER: _R.IGNORE,
                                       _A.USER_ERROR: _R.FAIL}.items()},
    # Pausing: the newest directive is kept for after the pause (normally the RESUME).
    **{(_K.PAUSE, a): r for a, r in {_A.DIRECTIVE: _R.KEEP, _A.SCALE: _R.REJECT, _A.CHECKPOINT: _R.REJECT,
                                     _A.PLAN: _R.IGNORE, _A.LOSS: _R.ABORT, _A.STRAGGLER: _R.IGNORE,
                                     _A.USER_ERROR: _R.FAIL}.items()},
    # The final checkpoint and evaluation: nothing changes any more; a loss now fails the job.
    **{(_K.FINISH, a): r for a, r in {_A.DIRECTIVE: _R.IGNORE, _A.SCALE: _R.REJECT, _A.CHECKPOINT: _R.REJECT,
                                      _A.PLAN: _R.IGNORE, _A.LOSS: _R.FAIL, _A.STRAGGLER: _R.IGNORE,
                                      _A.USER_ERROR: _R.FAIL}.items()},
}
# Paused (no executors; the slot stays taken until the resume): a directive is acted on at once
# (its run state decides: RESUME / RUN resume, PAUSE is a repeat), a scale or checkpoint is
# refused (the shape changes when the job resumes), a loss cannot happen.
PAUSED_RULES: dict[Arrival, Rule] = {
    _A.DIRECTIVE: _R.START, _A.SCALE: _R.REJECT, _A.CHECKPOINT: _R.REJECT, _A.PLAN: _R.IGNORE,
    _A.LOSS: _R.IGNORE, _A.STRAGGLER: _R.IGNORE, _A.USER_ERROR: _R.FAIL,
}


def rule(running: Optional[ChangeKind], arrival: Arrival, paused: bool = False) -> Rule:
    """What to do with `arrival` while `running` holds the slot (None: idle)."""
    if paused:
        return PAUSED_RULES[arrival]
    return RULES[(running, arrival)]
