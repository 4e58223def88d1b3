"""Typed fields of a control request's header, each refused with a RequestError naming the field
(the executor answers it as an error reply; the connection and the process go on)."""
from __future__ import annotations

from typing import Any

from psruntime.dataplane import RequestError


def int_list_field(h: dict[str, Any], name: str) -> list[int]:
    """A list of block ids (ints, not bools)."""
    v = h.get(name)
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise RequestError(f"field {name!r} must be a list of block ids")
    return v


def str_field(h: dict[str, Any], name: str) -> str:
    """A non-empty string."""
    v = h.get(name)
    if not isinstance(v, str) or not v:
        raise RequestError(f"field {name!r} must be a non-empty string")
    return v


def int_field(h: dict[str, Any], name: str, minimum: int = 0) -> int:
    """An int (not a bool) of at least `minimum`."""
    v = h.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise RequestError(f"field {name!r} must be an int >= {minimum}, got {v!r}")
    return v
