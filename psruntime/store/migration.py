"""Two-step block migration (dissertation §3.3.2) as a pure state machine: no I/O, injected clock.

Per block, on the executor that owns it (the source) and the one receiving it (the destination):

    source:       OWNED --BEGIN_HANDOVER--> HANDING_OVER --HANDOVER_ACKED--> MOVED
                                            HANDING_OVER --ABORT----------> OWNED
                                                                MOVED --REVERT--> OWNED
    destination:  ABSENT|MOVED --TAKE_OWNERSHIP--> INCOMING --DATA_RECEIVED--> OWNED
                                                   INCOMING --CANCEL-------> ABSENT

Requests are served in OWNED and HANDING_OVER, queued in INCOMING (drained in arrival order once
the data lands), and redirected in MOVED (to the destination) and ABSENT (by the ownership table).

Exactly-once. The source enters MOVED in the same event-loop step in which it snapshots the block,
so every operation that reached it earlier is in the snapshot and every later one is redirected:
never both, never neither. The destination enters INCOMING *before* the source switches to MOVED
(the source waits for that ack), so a redirected request always finds the destination queueing.
REVERT: the data could not be delivered after the ack and the destination confirmed it cancelled
its INCOMING block (so it applied nothing and its queue goes back by redirect); the source still
holds the block (it drops it only once delivered) and serves it again. Without that confirmation
the source stays MOVED: a copy it could not see land may have landed.
Departure from the paper: the dissertation lets the source hand over ownership and then send data;
we add the explicit TAKE_OWNERSHIP ack before the switch so that a redirected request can never
bounce off a destination that does not yet know it is the new owner.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Callable

from protocol.state_machine import InvalidTransition, TransitionTable


class BlockState(enum.Enum):
    ABSENT = "absent"
    OWNED = "owned"
    HANDING_OVER = "handing_over"
    MOVED = "moved"
    INCOMING = "incoming"


class MigrationEvent(enum.Enum):
    ASSIGN = "assign"                  # controller's initial placement (or restore from checkpoint)
    RELEASE = "release"                # controller takes an idle block away (e.g. after a restore elsewhere)
    BEGIN_HANDOVER = "begin_handover"  # source: controller asked to move the block
    HANDOVER_ACKED = "handover_acked"  # source: destination queues now; snapshot and redirect
    ABORT = "abort"                    # source: destination never acked; keep serving
    TAKE_OWNERSHIP = "take_ownership"  # destination: start queueing requests for the block
    DATA_RECEIVED = "data_received"    # destination: block data installed; drain the queue
    CANCEL = "cancel"                  # destination: the move was aborted before data came
    REVERT = "revert"                  # source: data never landed, the destination cancelled: serve again


class Disposition(enum.Enum):
    """What an executor does with a request for a block in a given state."""

    SERVE = "serve"
    QUEUE = "queue"
    REDIRECT = "redirect"


S, E = BlockState, MigrationEvent
TRANSITIONS: TransitionTable[BlockState, MigrationEvent, BlockState] = TransitionTable({
    (S.ABSENT, E.ASSIGN): S.OWNED,
    (S.MOVED, E.ASSIGN): S.OWNED,
    (S.OWNED, E.ASSIGN): S.OWNED,
    (S.OWNED, E.RELEASE): S.ABSENT,
    (S.MOVED, E.RELEASE): S.ABSENT,
    (S.ABSENT, E.RELEASE): S.ABSENT,
    (S.OWNED, E.BEGIN_HANDOVER): S.HANDING_OVER,
    (S.HANDING_OVER, E.HANDOVER_ACKED): S.MOVED,
    (S.HANDING_OVER, E.ABORT): S.OWNED,
    (S.MOVED, E.REVERT): S.OWNED,
    (S.ABSENT, E.TAKE_OWNERSHIP): S.INCOMING,
    (S.MOVED, E.TAKE_OWNERSHIP): S.INCOMING,
    (S.INCOMING, E.DATA_RECEIVED): S.OWNED,
    (S.INCOMING, E.CANCEL): S.ABSENT,
}, lambda state, event: InvalidTransition(f"event {event.value} is not allowed in state {state.value}", state, event))

DISPOSITION: dict[BlockState, Disposition] = {
    S.OWNED: Disposition.SERVE,
    S.HANDING_OVER: Disposition.SERVE,
    S.INCOMING: Disposition.QUEUE,
    S.MOVED: Disposition.REDIRECT,
    S.ABSENT: Disposition.REDIRECT,
}


def next_state(state: BlockState, event: MigrationEvent) -> BlockState:
    """The pure transition function; raises InvalidTransition for a pair not in TRANSITIONS."""
    return TRANSITIONS.next(state, event)


@dataclass(slots=True)
class BlockEntry:
    state: BlockState = BlockState.ABSENT
    peer: str | None = None          # MOVED/HANDING_OVER: destination; INCOMING: source
    since: float = 0.0               # clock time of the last transition
    transitions: int = 0             # how many it has had (names one stay in a state)


class BlockStates:
    """Migration state of every block on one executor, with transition times from an injected clock."""

    def __init__(self, num_blocks: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.num_blocks = num_blocks
        self._clock = clock
        self._entries = [BlockEntry() for _ in range(num_blocks)]

    def _entry(self, block: int) -> BlockEntry:
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise InvalidTransition(f"block {block!r} is out of range 0..{self.num_blocks - 1}")
        return self._entries[block]

    def state(self, block: int) -> BlockState:
        return self._entry(block).state

    def peer(self, block: int) -> str | None:
        return self._entry(block).peer

    def disposition(self, block: int) -> Disposition:
        return DISPOSITION[self._entry(block).state]

    def can(self, block: int, event: MigrationEvent) -> bool:
        return (self._entry(block).state, event) in TRANSITIONS

    def apply(self, block: int, event: MigrationEvent, peer: str | None = None) -> BlockState:
        """Apply `event` to `block`; `peer` is recorded for BEGIN_HANDOVER and TAKE_OWNERSHIP."""
        entry = self._entry(block)
        new = next_state(entry.state, event)
        if event in (MigrationEvent.BEGIN_HANDOVER, MigrationEvent.TAKE_OWNERSHIP):
            entry.peer = peer
        elif new in (BlockState.OWNED, BlockState.ABSENT):
            entry.peer = None
        entry.state = new
        entry.since = self._clock()
        entry.transitions += 1
        return new

    def transitions(self, block: int) -> int:
        """How many transitions `block` has had here: unchanged while it stays in its state."""
        return self._entry(block).transitions

    def blocks_in(self, state: BlockState) -> list[int]:
        return [b for b, e in enumerate(self._entries) if e.state is state]

    def stalled(self, timeout_s: float) -> list[int]:
        """Blocks stuck mid-migration (HANDING_OVER or INCOMING) for longer than `timeout_s`."""
        now = self._clock()
        return [b for b, e in enumerate(self._entries)
                if e.state in (BlockState.HANDING_OVER, BlockState.INCOMING) and now - e.since > timeout_s]
