"""The Harmony arbiter's wire format: fixed-size binary frames over the NM's unix socket.

An executor of a Harmony job takes a slot from its node's arbiter before every COMP / COMM
subtask (docs/harmony_arbiter.md, "Slots and rules"), so the channel sits on every mini-batch: no HTTP, no JSON, one
24-byte struct per message, little-endian:

    op u8 | kind u8 | flags u16 | request_id u32 | job u64 | executor u64

`kind` is a `SlotKind` in requests and a `Role` in a GRANT; `flags` of a CPU ACQUIRE is the number
of threads (cores of the node's CPU pool) the COMP will use (0 = 1: an older client), and of a CPU
GRANT the number granted (the request's, at most the pool); `job` and `executor` are 64-bit hashes
(`name_hash`) of the application id and the container id, carried by every request so the grant
log can name them. One connection per executor, requests pipelined: replies carry the request id
they answer. RELEASE, BUSY and IDLE get no reply (a released slot is the arbiter's to hand on).
"""
from __future__ import annotations

import enum
import hashlib
import struct
from typing import NamedTuple

FRAME = struct.Struct("<BBHIQQ")
FRAME_SIZE = FRAME.size          # 24


class Op(enum.IntEnum):
    """What a frame asks or tells."""

    # executor -> arbiter
    ACQUIRE = 1      # kind = SlotKind, flags = threads (CPU); answered by GRANT (maybe after a wait)
    RELEASE = 2      # give back a held slot or cancel a queued request; no reply
    BUSY = 3         # the primary network holder is transferring (default on its grant); no reply
    IDLE = 4         # the primary network holder only waits on servers now; no reply
    PING = 5         # answered at once by PONG: the channel's bare round trip
    # arbiter -> executor
    GRANT = 16       # kind = Role; flags = threads granted (CPU) / YIELDING when a secondary starts out yielding
    YIELD = 17       # to a secondary: flags = YIELDING (pause) or 0 (go on)
    PROMOTE = 18     # a secondary became the primary (it yields no more)
    PONG = 19
    ERROR = 20       # a request the arbiter refused (e.g. release of a slot never granted)


class SlotKind(enum.IntEnum):
    """What a subtask occupies on its node."""

    CPU = 1
    COMM = 2


class Role(enum.IntEnum):
    """Which slot a grant is: the CPU slot, or the primary / secondary network slot."""

    CPU = 1
    PRIMARY = 2
    SECONDARY = 3


YIELDING = 1
MAX_THREADS = 0xFFFF     # what a u16 `flags` can ask for


class Frame(NamedTuple):
    """One decoded frame."""

    op: int
    kind: int
    flags: int
    request_id: int
    job: int
    executor: int

    def pack(self) -> bytes:
        return FRAME.pack(self.op, self.kind, self.flags, self.request_id, self.job, self.executor)


def unpack(data: bytes | memoryview, offset: int = 0) -> Frame:
    return Frame(*FRAME.unpack_from(data, offset))


def name_hash(name: str) -> int:
    """A stable 64-bit id of an application or container id (not Python's salted hash())."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
