"""The HA role of one ResourceManager as a pure state machine (YARN's HAServiceState plus the
elector's view), with time as an argument.

    INITIALIZING --START--> STANDBY --ELECTED--> BECOMING_ACTIVE --RECOVERED--> ACTIVE
    BECOMING_ACTIVE / ACTIVE --FENCED | LEASE_EXPIRED | TRANSITION_TO_STANDBY--> STANDBY
    BECOMING_ACTIVE --RECOVERY_FAILED--> STANDBY
    STANDBY --TRANSITION_TO_STANDBY | SECRET_MISMATCH | SECRET_MATCHES--> STANDBY
    any but STOPPED --STOP--> STOPPED

ELECTED: this RM's campaign created the lease-bound leader key. FENCED: etcd says another RM holds
(or nobody holds) the leader key this RM's token names -- a write or a renewal found out; the RM
must stop acting at once. LEASE_EXPIRED: no renewal succeeded for a whole lease (etcd unreachable
or the lease gone): from then on another RM may be active, so this one steps down at that moment
without waiting to hear so. TRANSITION_TO_STANDBY: an operator's `elastane rm transition-to-standby`;
the RM then keeps out of elections for `hold_off_s`, so another takes over. RECOVERY_FAILED: the
elected RM could not rebuild its state; it keeps out of elections for `recovery_hold_off_s`, so a
healthy standby wins the next one instead of racing it every poll. SECRET_MISMATCH / SECRET_MATCHES:
the cluster secret's fingerprint stored in etcd stopped / started matching this RM's (rm/ha/elector.py
`secret_fingerprint`); the elector does not campaign meanwhile, and the reason says why.

The machine keeps the reason of its last change (for logs and /ws/v1/cluster/info), the epoch and
fencing token of its current term, and when its lease was last renewed. It decides nothing by
reading a clock: every method that needs the time takes `now`.
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Optional

from protocol.state_machine import InvalidTransition, TransitionTable

HISTORY = 20    # role changes kept for /ws/v1/cluster/info and the web UI
# After a failed recovery, how many leases the RM stays out of elections: a standby's poll (at most
# half a second) and campaign need far less, so a healthy standby takes over meanwhile; a recovery
# that keeps failing (it reads the whole store each time) is tried again no more often than this
# (docs/operating.md, "What a failover looks like").
RECOVERY_HOLD_OFF_LEASES = 3


class HAState(str, enum.Enum):
    INITIALIZING = "INITIALIZING"
    STANDBY = "STANDBY"
    BECOMING_ACTIVE = "BECOMING_ACTIVE"    # elected; rebuilding its state from the store
    ACTIVE = "ACTIVE"
    STOPPED = "STOPPED"

    @property
    def holds_leadership(self) -> bool:
        """The RM holds (or believes it holds) the leader key: it must renew and may write."""
        return self in (HAState.BECOMING_ACTIVE, HAState.ACTIVE)

    @property
    def yarn_name(self) -> str:
        """What /ws/v1/cluster/info's haState says: YARN's INITIALIZING / ACTIVE / STANDBY / STOPPED
        (an RM still recovering is not serving yet: STANDBY, as YARN's is until transitionToActive ends)."""
        return "STANDBY" if self == HAState.BECOMING_ACTIVE else self.value


class HAEvent(str, enum.Enum):
    START = "START"
    ELECTED = "ELECTED"
    RECOVERED = "RECOVERED"
    RECOVERY_FAILED = "RECOVERY_FAILED"
    FENCED = "FENCED"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    TRANSITION_TO_STANDBY = "TRANSITION_TO_STANDBY"
    SECRET_MISMATCH = "SECRET_MISMATCH"
    SECRET_MATCHES = "SECRET_MATCHES"
    STOP = "STOP"


def _invalid(state: HAState, event: HAEvent) -> InvalidTransition:
    return InvalidTransition(f"RM HA role: event {event.value} is invalid in state {state.value}", state, event)


_S, _E = HAState, HAEvent
HA_TRANSITIONS: TransitionTable[HAState, HAEvent, HAState] = TransitionTable({
    (_S.INITIALIZING, _E.START): _S.STANDBY,
    (_S.STANDBY, _E.ELECTED): _S.BECOMING_ACTIVE,
    # An operator's switch on a standby holds it out of the next elections too (no state change).
    (_S.STANDBY, _E.TRANSITION_TO_STANDBY): _S.STANDBY,
    # The stored cluster secret's fingerprint differs from this RM's (or matches again): the reason
    # and the history say so; the elector, which read it from etcd, decides whether to campaign.
    (_S.STANDBY, _E.SECRET_MISMATCH): _S.STANDBY,
    (_S.STANDBY, _E.SECRET_MATCHES): _S.STANDBY,
    (_S.BECOMING_ACTIVE, _E.RECOVERED): _S.ACTIVE,
    (_S.BECOMING_ACTIVE, _E.RECOVERY_FAILED): _S.STANDBY,
}, _invalid)
for _st in (_S.BECOMING_ACTIVE, _S.ACTIVE):
    for _ev in (_E.FENCED, _E.LEASE_EXPIRED, _E.TRANSITION_TO_STANDBY):
        HA_TRANSITIONS[(_st, _ev)] = _S.STANDBY
for _st in (_S.INITIALIZING, _S.STANDBY, _S.BECOMING_ACTIVE, _S.ACTIVE):
    HA_TRANSITIONS[(_st, _E.STOP)] = _S.STOPPED


@dataclass(frozen=True)
class RoleChange:
    """One transition, as the logs and /ws/v1/cluster/info show it."""

    at: float
    old: HAState
    new: HAState
    event: HAEvent
    reason: str


class HaRole:
    """One RM's HA role: state, the reason of its last change, the current term's epoch and fencing
    token, and the lease's renewal bookkeeping. Pure: every time is an argument."""

    def __init__(self, rm_id: str, lease_s: float, now: float, hold_off_s: Optional[float] = None,
                 recovery_hold_off_s: Optional[float] = None):
        self.rm_id = rm_id
        self.lease_s = lease_s
        # After an operator's transition-to-standby, how long this RM stays out of elections: two
        # leases, time enough for a standby's poll to see the key gone and campaign.
        self.hold_off_s = 2 * lease_s if hold_off_s is None else hold_off_s
        self.recovery_hold_off_s = (RECOVERY_HOLD_OFF_LEASES * lease_s if recovery_hold_off_s is None
                                    else recovery_hold_off_s)
        self.state = HAState.INITIALIZING
        self.since = now
        self.reason = "starting"
        self.epoch = 0          # this term's epoch (0: not active); part of new container ids
        self.token = 0          # this term's fencing token: the leader key's create revision
        self.renewed_at: Optional[float] = None   # send time of the last renewal etcd acknowledged
        self.campaign_not_before = now
        self.history: deque[RoleChange] = deque(maxlen=HISTORY)

    # ----- transitions ------------------------------------------------------------------------
    def fire(self, event: HAEvent, now: float, reason: str) -> RoleChange:
        """Apply `event` (InvalidTransition if it is not allowed now) and record why."""
        new = HA_TRANSITIONS.next(self.state, event)
        change = RoleChange(now, self.state, new, event, reason)
        self.state, self.since, self.reason = new, now, reason
        self.history.append(change)
        if new != HAState.BECOMING_ACTIVE and new != HAState.ACTIVE:
            self.epoch, self.token, self.renewed_at = 0, 0, None
        # Either hold-off extends one under way, never cuts it short.
        if event == HAEvent.TRANSITION_TO_STANDBY:
            self.campaign_not_before = max(self.campaign_not_before, now + self.hold_off_s)
        elif event == HAEvent.RECOVERY_FAILED:
            self.campaign_not_before = max(self.campaign_not_before, now + self.recovery_hold_off_s)
        return change

    def start(self, now: float) -> RoleChange:
        return self.fire(HAEvent.START, now, "joined the election as standby")

    def elected(self, now: float, epoch: int, token: int, lease_granted_at: float) -> RoleChange:
        """The campaign won: the leader key (created at revision `token`) is this RM's, under a
        lease granted by a request sent at `lease_granted_at`."""
        change = self.fire(HAEvent.ELECTED, now, f"elected active (epoch {epoch}); recovering state")
        self.epoch, self.token, self.renewed_at = epoch, token, lease_granted_at
        return change

    def renewed(self, sent_at: float) -> None:
        """etcd acknowledged a renewal sent at `sent_at`: the lease lasts until at least
        sent_at + lease_s on etcd's side (it restarts the TTL when it receives the request)."""
        if self.state.holds_leadership and (self.renewed_at is None or sent_at > self.renewed_at):
            self.renewed_at = sent_at

    # ----- questions --------------------------------------------------------------------------
    def lease_deadline(self) -> Optional[float]:
        """When this RM must consider its lease gone (None when it holds no leadership)."""
        if not self.state.holds_leadership or self.renewed_at is None:
            return None
        return self.renewed_at + self.lease_s

    def lease_expired(self, now: float) -> bool:
        deadline = self.lease_deadline()
        return deadline is not None and now >= deadline

    def may_campaign(self, now: float) -> bool:
        return self.state == HAState.STANDBY and now >= self.campaign_not_before

    @property
    def is_active(self) -> bool:
        return self.state == HAState.ACTIVE
