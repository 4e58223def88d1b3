"""The types of JSON documents that stay JSON: what a parser returns, and what an encoder takes.

Where a record has a type, it is a msgspec Struct (protocol/) or a TypedDict, decoded once. These
aliases are for the JSON that has no fixed schema by design -- a frame header before its op is known,
an app's free-form `data` / `hparams` before the app is known, a REST body a CLI only prints -- so
that such a value is still checked as JSON (a reader narrows with isinstance) instead of being Any.

- `JsonValue` / `JsonObject`: what a JSON parser (orjson, msgspec without a type) returns.
- `JsonIn` / `JsonInObject`: what an encoder accepts. Mapping and Sequence are read-only, so they are
  covariant: a `dict[str, int]` or a `list[str]` is a `JsonIn`, which a `JsonValue` (list and dict
  are invariant) would refuse.

The recursive definitions are for the type checker. At run time msgspec, which cannot resolve a
recursive alias ("ForwardRef is not supported"), sees a Struct field of type `JsonObject` as
`dict[str, Any]`: decoding JSON text it yields exactly the values `JsonValue` names, as before.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    JsonScalar = Union[None, bool, int, float, str]
    JsonValue = Union[JsonScalar, list["JsonValue"], dict[str, "JsonValue"]]
    JsonObject = dict[str, JsonValue]
    JsonIn = Union[JsonScalar, Sequence["JsonIn"], Mapping[str, "JsonIn"]]
    JsonInObject = Mapping[str, JsonIn]
else:
    from typing import Any
    JsonScalar = Union[None, bool, int, float, str]
    JsonValue = Any
    JsonObject = dict[str, Any]
    JsonIn = Any
    JsonInObject = Mapping[str, Any]


def json_int(value: JsonValue) -> int:
    """`int(value)` of a JSON number or numeric string, as a reader of a free-form JSON object
    (an app's data spec, a REST body) takes one; TypeError for a list, object or null."""
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


def json_float(value: JsonValue) -> float:
    """`float(value)` of a JSON number or numeric string; TypeError for a list, object or null."""
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


def json_object(value: JsonValue) -> JsonObject:
    """`value` if it is a JSON object, else {} (a missing or null field read as empty)."""
    return value if isinstance(value, dict) else {}


def json_list(value: JsonValue) -> list[JsonValue]:
    """`value` if it is a JSON array, else [] (a missing or null field read as empty)."""
    return value if isinstance(value, list) else []
