"""Async JSON-over-HTTP client (aiohttp keep-alive session, orjson codec, YARN error parsing)."""
from __future__ import annotations

from typing import Union

import aiohttp
import msgspec

from . import codec
from protocol.errors import ProtocolError
from protocol.json_types import JsonIn, JsonValue

# What a request may carry: a Struct (encoded by msgspec), JSON builtins, or bytes sent as they are.
Body = Union[msgspec.Struct, JsonIn, bytes, bytearray]


class RemoteError(ProtocolError):
    """A non-2xx answer; carries YARN's RemoteException fields when the server sent them."""

    def __init__(self, status: int, exception: str, message: str):
        super().__init__(f"HTTP {status} {exception}: {message}")
        self.status = status
        self.exception = exception
        self.message = message


class JsonHttpClient:
    """One keep-alive session to one base URL; `token` is sent as a bearer token on every call."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0,
                 user: str | None = None, connect_timeout_s: float | None = None,
                 read_timeout_s: float | None = None):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.user = user
        # connect_timeout_s bounds opening a connection, read_timeout_s each wait for more of the
        # answer (None: only the call's timeout_s): a host that went silent drops the SYNs, or
        # never answers on a kept-alive connection, and a client with somewhere else to go
        # (protocol/rm_failover.py) should not wait the whole call's timeout to learn it.
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout,
                                                  connector=aiohttp.TCPConnector(limit=64))
        return self._session

    async def request(self, method: str, path: str, body: Body = None,
                      params: dict[str, str] | None = None, token: str | None = None) -> JsonValue:
        """The answer's JSON (None for an empty body, the text for a non-JSON one); RemoteError
        with YARN's RemoteException fields for a 4xx / 5xx."""
        session = await self._get_session()
        headers = {"Accept": "application/json"}
        tok = token or self.token
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, bytearray)) else codec.dumps(body)
            headers["Content-Type"] = "application/json"
        params = dict(params or {})
        if self.user and "user.name" not in params:
            params["user.name"] = self.user
        async with session.request(method, self.base_url + path, data=data, headers=headers,
                                   params=params or None) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                exc, msg = "HTTPError", raw.decode(errors="replace")[:500]
                try:
                    doc = codec.loads(raw)
                    re_ = doc.get("RemoteException") if isinstance(doc, dict) else None
                    if isinstance(re_, dict):
                        exc, msg = str(re_.get("exception", exc)), str(re_.get("message", msg))
                except Exception:
                    pass
                raise RemoteError(resp.status, exc, msg)
            if not raw:
                return None
            ctype = resp.headers.get("Content-Type", "")
            if "json" in ctype:
                return codec.loads(raw)
            return raw.decode(errors="replace")

    async def get(self, path: str, params: dict[str, str] | None = None, token: str | None = None) -> JsonValue:
        return await self.request("GET", path, params=params, token=token)

    async def post(self, path: str, body: Body = None, params: dict[str, str] | None = None,
                   token: str | None = None) -> JsonValue:
        return await self.request("POST", path, body, params=params, token=token)

    async def put(self, path: str, body: Body = None, params: dict[str, str] | None = None,
                  token: str | None = None) -> JsonValue:
        return await self.request("PUT", path, body, params=params, token=token)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "JsonHttpClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
