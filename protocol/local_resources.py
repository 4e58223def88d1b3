"""YARN's LocalResource: a file the NM fetches into a container's working dir before it starts.

The JSON is YARN's REST form (the value of a `local-resources` entry):

    {"resource": "file:///shared/app.py", "type": "FILE", "visibility": "APPLICATION",
     "size": 4096, "timestamp": 1764130000000}

`type`: FILE (linked as it is), ARCHIVE (tar, tar.gz / tgz, zip: unpacked into a dir) or PATTERN
(a jar/zip unpacked whose entries matching `pattern` are kept; YARN's meaning for jars); `visibility`:
PUBLIC (cached once per node), PRIVATE (per user), APPLICATION (per app, removed with it). `size`
and `timestamp` (mtime, ms since the epoch) are what the client saw at submission: a resource that
changed since then fails the container, naming it. The entry's key is the link's name in the
working dir.
"""
from __future__ import annotations

from typing import Literal

import msgspec
from protocol.errors import ConfigurationError

ResourceType = Literal["FILE", "ARCHIVE", "PATTERN"]
Visibility = Literal["PUBLIC", "PRIVATE", "APPLICATION"]


class LocalResource(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One resource to localize (YARN's LocalResource)."""

    resource: str                           # a path or URL (file://, or any fsspec scheme)
    type: ResourceType = "FILE"
    visibility: Visibility = "APPLICATION"
    size: int = -1                          # bytes; -1 = not checked
    timestamp: int = -1                     # mtime in ms; -1 = not checked
    pattern: str = ""                       # PATTERN only: a regex of the entries to keep


class LocalResourceError(ConfigurationError, ValueError):
    """A local-resources entry that is malformed; the message names the entry and the field."""


# What the NM itself writes into a container's working dir (nodemanager/launcher.py): a resource
# linked there under this name would have the NM write through the link, into its cached copy.
LAUNCH_SCRIPT = "launch_container.sh"


def check_link_name(name: str) -> None:
    """A resource's key is one path component in the working dir: no '/', not '.' or '..', and not
    a name the NM writes there itself."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise LocalResourceError(f"local resource name {name!r}: must be one path component "
                                 "(no '/', not '.' or '..')")
    if name == LAUNCH_SCRIPT:
        raise LocalResourceError(f"local resource name {name!r}: the NodeManager writes its launch "
                                 "script under that name")


def decode_resources(raw: dict[str, object]) -> dict[str, LocalResource]:
    """Validate a {name: LocalResource JSON} mapping; errors name the entry and its field."""
    out: dict[str, LocalResource] = {}
    for name, value in raw.items():
        check_link_name(name)
        try:
            res = msgspec.convert(value, LocalResource, strict=True)
        except msgspec.ValidationError as e:
            raise LocalResourceError(f"local resource {name!r}: {e}") from None
        if not res.resource:
            raise LocalResourceError(f"local resource {name!r}: `resource` is empty")
        if res.type == "PATTERN" and not res.pattern:
            raise LocalResourceError(f"local resource {name!r}: type PATTERN needs a `pattern`")
        out[name] = res
    return out
