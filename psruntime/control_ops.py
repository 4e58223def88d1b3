"""The executor's control-op table: request record type -> handler (protocol.executor_ops).

A handler takes the decoded request and the frame's arrays and returns its reply record and the
reply's arrays (or an awaitable of that); it never sees the frame's header. `bind` types a handler
to its request, so a table can hold handlers of every request type and still call each with its own.
"""
from __future__ import annotations

from typing import Awaitable, Callable, Sequence, TypeVar, Union

import numpy as np

from protocol.executor_ops import ControlReply, ExecutorRequest

Arrays = Sequence[np.ndarray]
Answer = tuple[ControlReply, Sequence[np.ndarray]]
Outcome = Union[Answer, Awaitable[Answer]]
Handler = Callable[[ExecutorRequest, Arrays], Outcome]
OpTable = dict[type[ExecutorRequest], Handler]
Q = TypeVar("Q", bound=ExecutorRequest)


def bind(kind: type[Q], fn: Callable[[Q, Arrays], Outcome]) -> tuple[type[ExecutorRequest], Handler]:
    """A table entry for `fn`, the handler of requests of type `kind`."""
    def call(request: ExecutorRequest, arrays: Arrays) -> Outcome:
        # The table dispatches by type, so this holds; the check keeps the handler's type honest.
        assert isinstance(request, kind), (request, kind)
        return fn(request, arrays)
    return kind, call


def table(*entries: tuple[type[ExecutorRequest], Handler]) -> OpTable:
    """An op table of `bind` entries (one per request type)."""
    out: OpTable = {}
    for kind, fn in entries:
        if kind in out:
            raise ValueError(f"two handlers for {kind.__name__}")
        out[kind] = fn
    return out


def op_name(kind: type[ExecutorRequest]) -> str:
    """The op tag a request type travels under."""
    tag = kind.__struct_config__.tag
    assert isinstance(tag, str), kind
    return tag
