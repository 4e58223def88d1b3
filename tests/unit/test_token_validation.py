"""Bearer tokens that are not ASCII text are malformed tokens (401), never an internal error."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from protocol import tokens
from protocol.http_server import json_response, make_app, require_token

SECRET = "k" * 64


@pytest.mark.parametrize("token", ["\udcff.AAAA", "AAAA.\udcff", "é.AAAA", "\udcff" + tokens.sign(SECRET, tokens.NM, {}, 60, now=0.0)],
                         ids=["surrogate-payload", "surrogate-signature", "latin1", "surrogate-before-a-signed-token"])
def test_a_non_ascii_token_is_a_token_error(token: str) -> None:
    with pytest.raises(tokens.TokenError, match="malformed token"):
        tokens.verify(SECRET, token, tokens.NM)


async def test_a_non_utf8_bearer_token_is_answered_401() -> None:
    app = make_app()

    async def handler(request: web.Request) -> web.Response:
        require_token(request, SECRET, tokens.NM)
        return json_response({})

    app.router.add_post("/internal/v1/x", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # Byte \xff in the header: aiohttp hands the handler a surrogate for it.
        writer.write(b"POST /internal/v1/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff.AAAA\r\n"
                     b"Content-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
        writer.close()
        status = answer.split(b"\r\n", 1)[0]
        assert status.startswith(b"HTTP/1.1 401"), answer[:300]
        assert b"malformed token" in answer
    finally:
        await runner.cleanup()
