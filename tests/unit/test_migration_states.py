"""The pure two-step migration state machine: transitions, dispositions, timeouts (fake clock)."""
from __future__ import annotations

import pytest

from psruntime.store.migration import (TRANSITIONS, BlockState, BlockStates, Disposition, InvalidTransition,
                                 MigrationEvent, next_state)
from fakes import FakeClock

S, E = BlockState, MigrationEvent


def test_source_and_destination_paths() -> None:
    src, dst = BlockStates(2), BlockStates(2)
    src.apply(0, E.ASSIGN)
    assert src.disposition(0) is Disposition.SERVE
    src.apply(0, E.BEGIN_HANDOVER, peer="dst")
    assert src.disposition(0) is Disposition.SERVE  # still the owner until the destination acks
    dst.apply(0, E.TAKE_OWNERSHIP, peer="src")
    assert dst.disposition(0) is Disposition.QUEUE and dst.peer(0) == "src"
    src.apply(0, E.HANDOVER_ACKED)
    assert src.state(0) is S.MOVED and src.peer(0) == "dst" and src.disposition(0) is Disposition.REDIRECT
    dst.apply(0, E.DATA_RECEIVED)
    assert dst.state(0) is S.OWNED and dst.peer(0) is None
    # ... and back again: the old source takes the block from MOVED.
    dst.apply(0, E.BEGIN_HANDOVER, peer="src")
    src.apply(0, E.TAKE_OWNERSHIP, peer="dst")
    dst.apply(0, E.HANDOVER_ACKED)
    src.apply(0, E.DATA_RECEIVED)
    assert src.state(0) is S.OWNED and dst.state(0) is S.MOVED


def test_abort_and_cancel() -> None:
    src, dst = BlockStates(1), BlockStates(1)
    src.apply(0, E.ASSIGN)
    src.apply(0, E.BEGIN_HANDOVER, peer="d")
    assert src.apply(0, E.ABORT) is S.OWNED and src.peer(0) is None
    dst.apply(0, E.TAKE_OWNERSHIP, peer="s")
    assert dst.apply(0, E.CANCEL) is S.ABSENT


@pytest.mark.parametrize("state,event", [
    (S.ABSENT, E.BEGIN_HANDOVER),        # cannot move a block we do not own
    (S.HANDING_OVER, E.BEGIN_HANDOVER),  # a block is moved by one migration at a time
    (S.OWNED, E.TAKE_OWNERSHIP),         # two owners never
    (S.INCOMING, E.TAKE_OWNERSHIP),
    (S.OWNED, E.DATA_RECEIVED),
    (S.MOVED, E.HANDOVER_ACKED),
    (S.INCOMING, E.ASSIGN),              # a broadcast cannot cut a migration short
    (S.HANDING_OVER, E.ASSIGN),
])
def test_invalid_transitions(state: BlockState, event: MigrationEvent) -> None:
    with pytest.raises(InvalidTransition, match=event.value):
        next_state(state, event)


def test_invalid_transition_leaves_state_unchanged() -> None:
    st = BlockStates(1)
    with pytest.raises(InvalidTransition):
        st.apply(0, E.DATA_RECEIVED)
    assert st.state(0) is S.ABSENT
    with pytest.raises(InvalidTransition, match="out of range"):
        st.apply(5, E.ASSIGN)


def test_at_most_one_serving_state_per_block_pair() -> None:
    # Exhaustive check over the table: any state reachable with SERVE at the destination comes
    # only from DATA_RECEIVED or ASSIGN, never from TAKE_OWNERSHIP directly.
    for (state, event), new in TRANSITIONS.items():
        if event is E.TAKE_OWNERSHIP:
            assert new is S.INCOMING
        if new is S.MOVED:
            assert (state, event) == (S.HANDING_OVER, E.HANDOVER_ACKED)


def test_stalled_uses_injected_clock() -> None:
    clock = FakeClock(0.0)
    st = BlockStates(3, clock)
    st.apply(0, E.ASSIGN)
    st.apply(0, E.BEGIN_HANDOVER, peer="d")
    clock.t = 5.0
    st.apply(1, E.TAKE_OWNERSHIP, peer="s")
    clock.t = 11.0
    assert st.stalled(10.0) == [0]
    clock.t = 16.0
    assert st.stalled(10.0) == [0, 1]
    st.apply(1, E.DATA_RECEIVED)
    assert st.stalled(10.0) == [0]
    assert st.blocks_in(S.HANDING_OVER) == [0]
