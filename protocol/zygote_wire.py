"""The NodeManager <-> executor zygote channel: typed messages in length-prefixed frames.

The NM keeps one pre-started interpreter per node (nodemanager.zygote) with the executor's modules
already imported; to start a warm container it sends a `WarmLaunch`, the zygote forks a child that
becomes the container's process (or hands it to a spare child forked ahead, `WarmSpare`) and
answers `WarmStarted` (or `WarmFailed`), and when a child ends
the zygote reaps it and sends `WarmExited` with its wait status. Once it has imported its modules it
sends `WarmReady` first (a launch sent earlier waits on the channel like any other). Frames are a 4-byte big-endian
length and a msgpack body (msgspec), over a unix socketpair the NM creates.
"""
from __future__ import annotations

import struct
from typing import Union

import msgspec
from protocol.errors import ProtocolError

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 20          # a launch's env and argv; anything bigger is a bug
CGROUP_JOIN_FAILED_EXIT = 125    # a container that could not join its cgroup (cold or warm launch)


class WarmLaunch(msgspec.Struct, tag="launch", forbid_unknown_fields=True):
    """Fork a child that runs `module` as __main__ with `argv`, as the container `container_id`:
    its own session (process group = pid), joined to `cgroup_procs` first, in `cwd` with exactly
    `env`, stdin from /dev/null, stdout / stderr appended to the given files; its exit code goes to
    `exit_file` (written atomically, as the cold launch's wrapper does)."""

    request_id: int
    container_id: str
    module: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    stdout: str
    stderr: str
    exit_file: str
    cgroup_procs: list[str] = []
    # A spare (WarmSpare) to run it in instead of a fresh fork: already in its session and in the
    # cgroups the NM has since given the container's limits, so `cgroup_procs` is not joined again.
    spare_pid: int = 0


class WarmSpare(msgspec.Struct, tag="spare", forbid_unknown_fields=True):
    """Fork a spare child: its own session, joined to `cgroup_procs`, then waiting for a WarmLaunch
    naming it (`spare_pid`). Answered `WarmStarted` once it has joined (`WarmFailed` if it could not);
    it exits, reported as any child, when the zygote closes. Moving a process into a cgroup waits for
    an RCU grace period on most hosts (15-20 ms): a spare pays it before a launch needs it."""

    request_id: int
    cgroup_procs: list[str]


class WarmStarted(msgspec.Struct, tag="started", forbid_unknown_fields=True):
    request_id: int
    pid: int


class WarmFailed(msgspec.Struct, tag="failed", forbid_unknown_fields=True):
    request_id: int
    error: str


class WarmExited(msgspec.Struct, tag="exited", forbid_unknown_fields=True):
    """A child ended; `status` is its raw wait status (os.waitstatus_to_exitcode decodes it)."""

    pid: int
    status: int


class WarmReady(msgspec.Struct, tag="ready", forbid_unknown_fields=True):
    """The zygote imported its modules and serves from now on (sent once, first)."""

    preload_s: float


ZygoteRequest = Union[WarmLaunch, WarmSpare]
ZygoteReply = Union[WarmStarted, WarmFailed, WarmExited, WarmReady]

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(ZygoteRequest)
_reply_decoder = msgspec.msgpack.Decoder(ZygoteReply)


class FrameError(ProtocolError, ValueError):
    """A frame that is too big or does not decode."""


def frame(msg: msgspec.Struct) -> bytes:
    body = _encoder.encode(msg)
    return HEADER.pack(len(body)) + body


def body_length(header: bytes) -> int:
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        raise FrameError(f"zygote frame of {n} bytes (at most {MAX_FRAME})")
    return int(n)


def decode_request(body: bytes) -> ZygoteRequest:
    try:
        req: ZygoteRequest = _request_decoder.decode(body)
        return req
    except msgspec.DecodeError as e:
        raise FrameError(f"bad zygote request: {e}") from None


def decode_reply(body: bytes) -> ZygoteReply:
    try:
        reply: ZygoteReply = _reply_decoder.decode(body)
        return reply
    except msgspec.DecodeError as e:
        raise FrameError(f"bad zygote reply: {e}") from None


__all__ = ["CGROUP_JOIN_FAILED_EXIT", "FrameError", "HEADER", "MAX_FRAME", "WarmExited", "WarmFailed", "WarmLaunch", "WarmSpare", "WarmStarted",
           "ZygoteReply", "ZygoteRequest", "body_length", "decode_reply", "decode_request", "frame"]
