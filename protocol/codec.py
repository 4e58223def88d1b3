"""JSON wire codec: typed bodies are decoded and encoded by msgspec in one pass, other JSON by orjson.

A typed body (`decode_as` on bytes) goes straight from JSON into its Struct with a msgspec decoder
kept per type. Parsing with orjson first and converting the builtins after built every dict and
list twice: an NM heartbeat took 0.9 us to decode that way against 0.2 us, one carrying a
utilization report 4.1 against 1.7 us. A Struct is likewise encoded directly (0.5 against 0.13 us
for a heartbeat response); anything else (dicts holding Structs included) goes through orjson.
"""
from __future__ import annotations

from typing import Any, TypeVar, cast

import msgspec
import orjson

T = TypeVar("T")


class DecodeError(ValueError):
    """A request body that is not valid JSON or does not match its schema; the message names the field."""


_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


def dumps(obj: Any) -> bytes:
    """Encode to JSON bytes: a Struct by msgspec directly, anything else by orjson (Structs inside
    it turned into builtins first)."""
    if isinstance(obj, msgspec.Struct):
        return _ENCODER.encode(obj)
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
    try:
        if isinstance(raw, (bytes, str)):
            decoder = _DECODERS.get(typ)
            if decoder is None:
                decoder = _DECODERS[typ] = msgspec.json.Decoder(typ, strict=True)
            return cast(T, decoder.decode(raw))
        return msgspec.convert(raw, typ, strict=True)
    except msgspec.ValidationError as e:
        raise DecodeError(str(e)) from None
    except msgspec.DecodeError as e:     # not JSON at all (ValidationError is its subclass)
        raise DecodeError(f"malformed JSON: {e}") from None


def to_builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)
