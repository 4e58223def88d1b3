"""JSON wire codec: orjson on the wire, msgspec for typed validation of request bodies."""
from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import orjson

T = TypeVar("T")


class DecodeError(ValueError):
    """A request body that is not valid JSON or does not match its schema; the message names the field."""


def dumps(obj: Any) -> bytes:
    """Encode to JSON bytes; msgspec Structs and enums are turned into builtins first."""
    return orjson.dumps(obj, default=_default)


def _default(obj: Any) -> Any:
    if isinstance(obj, msgspec.Struct):
        return msgspec.to_builtins(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def loads(raw: bytes | str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"malformed JSON: {e}") from None


def decode_as(raw: bytes | str | Any, typ: type[T]) -> T:
    """Decode raw JSON (or an already decoded object) into `typ`, raising DecodeError naming the field."""
    obj = loads(raw) if isinstance(raw, (bytes, str)) else raw
    try:
        return msgspec.convert(obj, typ, strict=True)
    except msgspec.ValidationError as e:
        raise DecodeError(str(e)) from None


def to_builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)
