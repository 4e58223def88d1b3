"""JSON wire codec: typed bodies are decoded and encoded by msgspec in one pass, other JSON by orjson.

A typed body (`decode_as` on bytes) goes straight from JSON into its Struct with a msgspec decoder
kept per type. Parsing with orjson first and converting the builtins after built every dict and
list twice: an NM heartbeat took 0.9 us to decode that way against 0.2 us, one carrying a
utilization report 4.1 against 1.7 us. A Struct is likewise encoded directly (0.5 against 0.13 us
for a heartbeat response); anything else (dicts holding Structs included) goes through orjson.

Numbers: a body holding an integer outside the signed/unsigned 64-bit range, or a number that is
not finite (NaN, Infinity, 1e400), is refused with a DecodeError naming the field path. msgspec
would keep such an integer exactly and orjson turn it into a lossy float, and once stored it breaks
every later orjson encoding of it (one bad `hparams` value once took GET /apps down). The check is
a prefilter in C calls (a run of 19 digits, or a 3-digit exponent; about 1 us for a 150-byte
heartbeat); only a body that trips it is parsed again to find the field.
"""
from __future__ import annotations

import decimal
import re
from typing import TypeVar, cast

import msgspec
import orjson
from protocol.errors import ProtocolError
from protocol.json_types import JsonValue

T = TypeVar("T")


class DecodeError(ProtocolError, ValueError):
    """A request body that is not valid JSON or does not match its schema; the message names the field."""


_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[type[object], msgspec.json.Decoder[object]] = {}


_INT_MIN, _INT_MAX = -(2 ** 63), 2 ** 64 - 1
# digits -> "0", a number's exponent marker -> "e", all else -> " ": then two substring searches
_NUMBER_SHAPE = bytes(48 if 48 <= i <= 57 else 101 if i in (69, 101) else 32 for i in range(256))
_LONG_RUN = b"0" * 19
# a float kept as its decimal text, so an out-of-range one is found (and named) instead of failing
_EXACT = msgspec.json.Decoder(float_hook=decimal.Decimal)
_NON_FINITE = re.compile(rb"-?(NaN|Infinity)")


def check_numbers(raw: bytes | str) -> None:
    """Raise DecodeError naming the field of an integer outside 64 bits or a non-finite number in
    the JSON text `raw`; a body that is not JSON at all is left to the decoder to report."""
    b = raw.encode() if isinstance(raw, str) else raw
    shape = b.translate(_NUMBER_SHAPE)
    if _LONG_RUN not in shape and not _has_big_exponent(shape):
        return
    try:
        tree = _EXACT.decode(b)
    except msgspec.DecodeError:
        return
    _walk(tree, "")


def _has_big_exponent(shape: bytes) -> bool:
    """An exponent of three or more digits ("e" followed by "000" in the shape; a sign between
    them is a space there, so both spellings are looked for)."""
    return b"e000" in shape or b"e 000" in shape


def _walk(v: object, path: str) -> None:
    if isinstance(v, dict):
        for k, x in v.items():
            _walk(x, f"{path}.{k}" if path else str(k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _walk(x, f"{path}[{i}]")
    elif isinstance(v, bool):
        return
    elif isinstance(v, int):
        if not _INT_MIN <= v <= _INT_MAX:
            raise DecodeError(f"{path or '$'}: integer {v} is outside the 64-bit range")
    elif isinstance(v, decimal.Decimal):
        if not v.is_finite() or float(v) in (float("inf"), float("-inf")):
            raise DecodeError(f"{path or '$'}: number {v} is not finite as a 64-bit float")


def _malformed(raw: bytes | str, e: Exception) -> DecodeError:
    """A parse error's DecodeError; NaN and Infinity (not JSON, but what some encoders write for
    non-finite floats) are named as such."""
    b = raw.encode() if isinstance(raw, str) else raw
    m = _NON_FINITE.search(b)
    if m is not None:
        return DecodeError(f"non-finite number {m.group().decode()} at byte {m.start()}: "
                           f"JSON numbers must be finite")
    return DecodeError(f"malformed JSON: {e}")


def dumps(obj: object) -> bytes:
    """Encode to JSON bytes: a Struct by msgspec directly, anything else by orjson (Structs inside
    it turned into builtins first). Any object those encoders take; TypeError for one they do not."""
    if isinstance(obj, msgspec.Struct):
        return _ENCODER.encode(obj)
    return orjson.dumps(obj, default=_default)


def _default(obj: object) -> object:
    if isinstance(obj, msgspec.Struct):
        return msgspec.to_builtins(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def loads(raw: bytes | str) -> JsonValue:
    """Untyped JSON, its numbers checked (see the module doc)."""
    try:
        out = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        check_numbers(raw)         # 1e400: name its field
        raise _malformed(raw, e) from None
    check_numbers(raw)
    value: JsonValue = out
    return value


def decode_as(raw: object, typ: type[T]) -> T:
    """Decode raw JSON (bytes or str) or an already decoded object (builtins, as msgspec.convert
    takes) into `typ`, raising DecodeError naming the field."""
    try:
        if isinstance(raw, (bytes, str)):
            decoder = _DECODERS.get(typ)
            if decoder is None:
                decoder = _DECODERS[typ] = msgspec.json.Decoder(typ, strict=True)
            out = cast(T, decoder.decode(raw))
            check_numbers(raw)
            return out
        return msgspec.convert(raw, typ, strict=True)
    except msgspec.ValidationError as e:
        if isinstance(raw, (bytes, str)):
            check_numbers(raw)     # "Number out of range": name its field
        raise DecodeError(str(e)) from None
    except msgspec.DecodeError as e:     # not JSON at all (ValidationError is its subclass)
        raise _malformed(raw if isinstance(raw, (bytes, str)) else b"", e) from None


def to_builtins(obj: object) -> JsonValue:
    """`obj` (Structs, dataclasses, datetimes... inside builtins) as JSON builtins."""
    out: JsonValue = msgspec.to_builtins(obj)
    return out
