"""Blocking JSON-over-HTTP calls for the benchmarks' "user" scripts (RM REST, AM status and scale)."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Optional

import msgspec


def http_json(url: str, method: str = "GET", body: Any = None, timeout_s: float = 30.0,
              user: Optional[str] = None, headers: Optional[dict[str, str]] = None) -> Any:
    """The decoded JSON reply (None for an empty one); `body` is JSON builtins or a msgspec Struct
    (a protocol/ record, encoded as its writer and reader type it); `user` is sent as Hadoop's `user.name`;
    `headers` are added (e.g. the AM-control token's Authorization).
    An HTTP error raises RuntimeError with the status and the start of the body."""
    if user is not None:
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"user.name": user})
    if isinstance(body, msgspec.Struct):
        data: Optional[bytes] = msgspec.json.encode(body)
    else:
        data = json.dumps(body).encode() if body is not None else (b"" if method in ("POST", "PUT") else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            payload = r.read()
            return json.loads(payload) if payload else None
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{method} {url}: HTTP {e.code}: {e.read()[:500]!r}") from None
