"""aiohttp server helpers shared by the RM, NMs and AMs: JSON responses, error middleware, auth."""
from __future__ import annotations

import logging
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler

from . import codec, tokens
from .json_types import JsonObject
from .remote_exception import ApiError, BadRequest, Unauthorized, remote_exception_body

log = logging.getLogger(__name__)
T = TypeVar("T")

JSON = "application/json"


def json_response(data: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=codec.dumps(data), status=status, content_type=JSON, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn ApiError into YARN's RemoteException body; no request can crash a daemon."""
    try:
        return await handler(request)
    except Exception as e:
        resp = error_response(request, e)
        if resp is None:
            raise
        return resp


def error_response(request: web.Request, e: Exception) -> web.Response | None:
    """What error_middleware answers for `e`, raised while serving `request` (call it from the
    `except` block: a bug is logged with its traceback), or None for an aiohttp HTTPException that
    aiohttp itself should answer. Shared so a daemon can fold it into its one middleware (rm/server.py)."""
    if isinstance(e, ApiError):
        return json_response(e.body(), status=e.status)
    if isinstance(e, web.HTTPException):
        if e.status >= 400 and request.path.startswith(("/ws/", "/internal/")):
            name = {404: "NotFoundException", 405: "WebApplicationException"}.get(e.status, "WebApplicationException")
            return json_response(remote_exception_body(name, e.reason or str(e), "javax.ws.rs.WebApplicationException"),
                                 status=e.status)
        return None
    # a bug must not take the daemon down
    log.exception("internal error serving %s %s", request.method, request.path)
    return json_response(remote_exception_body("InternalError", f"{type(e).__name__}: {e}",
                                                "java.lang.RuntimeException"), status=500)


async def read_json(request: web.Request, typ: type[T]) -> T:
    """Read and validate a request body as `typ`; 400 naming the field on any problem."""
    raw = await request.read()
    if not raw:
        raise BadRequest("request body is empty")
    try:
        return codec.decode_as(raw, typ)
    except codec.DecodeError as e:
        raise BadRequest(str(e)) from None


def require_token(request: web.Request, secret: str, kind: str) -> JsonObject:
    """Verify the request's bearer token of `kind` with the cluster secret; 401 otherwise."""
    token = tokens.token_from_header(request.headers.get("Authorization"))
    if token is None:
        raise Unauthorized("missing bearer token")
    try:
        return tokens.verify(secret, token, kind)
    except tokens.TokenError as e:
        raise Unauthorized(f"invalid {kind} token: {e}") from None


def make_app() -> web.Application:
    return web.Application(middlewares=[error_middleware], client_max_size=16 * 1024 * 1024)
