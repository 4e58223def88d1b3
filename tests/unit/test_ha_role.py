"""The RM's HA role machine (rm/ha/role.py): every transition in the table, every pair outside it
raising, and the lease and hold-off bookkeeping with time as an argument."""
from __future__ import annotations

import pytest

from protocol.state_machine import InvalidTransition
from rm.ha.role import HA_TRANSITIONS, RECOVERY_HOLD_OFF_LEASES, HAEvent, HaRole, HAState

S, E = HAState, HAEvent

EXPECTED = {
    (S.INITIALIZING, E.START): S.STANDBY,
    (S.INITIALIZING, E.STOP): S.STOPPED,
    (S.STANDBY, E.ELECTED): S.BECOMING_ACTIVE,
    (S.STANDBY, E.TRANSITION_TO_STANDBY): S.STANDBY,
    (S.STANDBY, E.SECRET_MISMATCH): S.STANDBY,
    (S.STANDBY, E.SECRET_MATCHES): S.STANDBY,
    (S.STANDBY, E.STOP): S.STOPPED,
    (S.BECOMING_ACTIVE, E.RECOVERED): S.ACTIVE,
    (S.BECOMING_ACTIVE, E.RECOVERY_FAILED): S.STANDBY,
    (S.BECOMING_ACTIVE, E.FENCED): S.STANDBY,
    (S.BECOMING_ACTIVE, E.LEASE_EXPIRED): S.STANDBY,
    (S.BECOMING_ACTIVE, E.TRANSITION_TO_STANDBY): S.STANDBY,
    (S.BECOMING_ACTIVE, E.STOP): S.STOPPED,
    (S.ACTIVE, E.FENCED): S.STANDBY,
    (S.ACTIVE, E.LEASE_EXPIRED): S.STANDBY,
    (S.ACTIVE, E.TRANSITION_TO_STANDBY): S.STANDBY,
    (S.ACTIVE, E.STOP): S.STOPPED,
}


def test_the_table_is_exactly_the_documented_machine():
    assert dict(HA_TRANSITIONS) == EXPECTED


@pytest.mark.parametrize("state,event", sorted(EXPECTED, key=str))
def test_every_transition(state, event):
    assert HA_TRANSITIONS.next(state, event) == EXPECTED[(state, event)]


@pytest.mark.parametrize("state,event", [(s, e) for s in S for e in E if (s, e) not in EXPECTED])
def test_every_other_pair_raises_naming_state_and_event(state, event):
    with pytest.raises(InvalidTransition, match=f"{event.value}.*{state.value}"):
        HA_TRANSITIONS.next(state, event)


def active_role(now: float = 100.0, lease_s: float = 5.0) -> HaRole:
    role = HaRole("rm1", lease_s, now=now - 1)
    role.start(now - 1)
    role.elected(now, epoch=3, token=42, lease_granted_at=now)
    role.fire(E.RECOVERED, now, "recovered 0 apps")
    return role


def test_a_term_carries_epoch_and_token_until_it_ends_and_the_reason_is_kept():
    role = active_role()
    assert role.state == S.ACTIVE and role.is_active and (role.epoch, role.token) == (3, 42)
    role.fire(E.FENCED, 101.0, "another RM holds the leader key")
    assert role.state == S.STANDBY and not role.is_active
    assert (role.epoch, role.token, role.renewed_at) == (0, 0, None)
    assert role.reason == "another RM holds the leader key" and role.since == 101.0
    assert [c.new for c in role.history] == [S.STANDBY, S.BECOMING_ACTIVE, S.ACTIVE, S.STANDBY]
    assert role.history[-1].event == E.FENCED


def test_the_lease_runs_from_the_last_acknowledged_renewal_send_time():
    role = active_role(now=100.0, lease_s=5.0)
    assert role.lease_deadline() == 105.0
    assert not role.lease_expired(104.9) and role.lease_expired(105.0)
    role.renewed(sent_at=103.0)
    assert role.lease_deadline() == 108.0
    role.renewed(sent_at=102.0)          # a late answer to an older renewal does not move it back
    assert role.lease_deadline() == 108.0
    role.fire(E.LEASE_EXPIRED, 108.0, "etcd unreachable")
    assert role.lease_deadline() is None and not role.lease_expired(1e9)
    role.renewed(sent_at=109.0)          # a standby has no lease to renew
    assert role.renewed_at is None


def test_an_operators_switch_keeps_the_rm_out_of_elections_for_the_hold_off():
    role = active_role(now=100.0, lease_s=5.0)
    assert role.hold_off_s == 10.0
    role.fire(E.TRANSITION_TO_STANDBY, 100.0, "transition-to-standby by admin")
    assert not role.may_campaign(109.9) and role.may_campaign(110.0)
    role.fire(E.TRANSITION_TO_STANDBY, 110.0, "again, on the standby")
    assert role.state == S.STANDBY and not role.may_campaign(119.0) and role.may_campaign(120.0)


def test_a_failed_recovery_keeps_the_rm_out_of_elections_for_a_few_leases():
    role = HaRole("rm1", 5.0, now=99.0)
    role.start(99.0)
    assert role.may_campaign(100.0)
    role.elected(100.0, epoch=3, token=42, lease_granted_at=100.0)
    role.fire(E.RECOVERY_FAILED, 101.0, "recovery failed: etcd unreachable")
    assert role.state == S.STANDBY and RECOVERY_HOLD_OFF_LEASES >= 2
    back = 101.0 + RECOVERY_HOLD_OFF_LEASES * 5.0
    assert not role.may_campaign(101.0) and not role.may_campaign(back - 0.01) and role.may_campaign(back)
    # An operator's switch meanwhile (two leases) does not cut the longer hold-off short.
    role.fire(E.TRANSITION_TO_STANDBY, 102.0, "transition-to-standby by root")
    assert not role.may_campaign(back - 0.01) and role.may_campaign(back)


def test_only_a_standby_campaigns():
    role = HaRole("rm1", 5.0, now=0.0)
    assert not role.may_campaign(0.0)        # INITIALIZING
    role.start(0.0)
    assert role.may_campaign(0.0)
    role.elected(1.0, 1, 7, 1.0)
    assert role.state == S.BECOMING_ACTIVE and not role.may_campaign(2.0)
    assert role.state.yarn_name == "STANDBY"   # not serving until recovered, as YARN's
    role.fire(E.STOP, 2.0, "SIGTERM")
    assert role.state == S.STOPPED and not role.may_campaign(10.0)
    with pytest.raises(InvalidTransition):
        role.fire(E.START, 3.0, "")
