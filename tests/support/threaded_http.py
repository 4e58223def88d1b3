"""A stdlib HTTP server in a background thread, for tests that fake the RM or an AM."""
from __future__ import annotations

import json
import threading
import urllib.parse
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator


@contextmanager
def serve_in_thread(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on an ephemeral localhost port; yields "127.0.0.1:PORT"; stops on exit."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join()


Route = Callable[[str, str, dict[str, list[str]], Any], tuple[int, Any]]


@contextmanager
def serve_routes(route: Route, methods: tuple[str, ...] = ("GET", "POST", "PUT")) -> Iterator[str]:
    """Serve `route(method, path, query, json_body) -> (status, reply)` like serve_in_thread: a str
    reply goes out as text/plain, anything else as JSON (None: an empty body)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _handle(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n)) if n else None
            status, out = route(self.command, url.path, urllib.parse.parse_qs(url.query), body)
            raw = out.encode() if isinstance(out, str) else (json.dumps(out).encode() if out is not None else b"")
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(out, str) else "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    for m in methods:
        setattr(Handler, f"do_{m}", Handler._handle)
    with serve_in_thread(Handler) as address:
        yield address
