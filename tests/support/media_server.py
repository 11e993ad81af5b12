"""A tiny HTTP server on loopback whose answers a test changes while it runs.

Why: an engine fetching image URLs must get what the URL serves *now* — other content, a 404, a
redirect — so the tests need a server they can change between requests. Each path answers with
the `Route` set for it (404 when none); every request is counted by (method, path).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

__all__ = ["MediaServer", "Route"]


@dataclass(frozen=True)
class Route:
    """What one path answers: a status, a body, headers (e.g. ``Location`` for a redirect)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class MediaServer:
    """``with MediaServer() as media: media.routes["/a.png"] = Route(body=png)``; stopped on exit."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: Counter[tuple[str, str]] = Counter()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(body=True)

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def _answer(self, body: bool) -> None:
                owner.requests[self.command, self.path] += 1
                route = owner.routes.get(self.path, Route(404, b"not found"))
                self.send_response(route.status)
                headers = {"Content-Type": "image/png", **route.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                if body:
                    self.wfile.write(route.body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: the counts are the record

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def fetches(self, path: str) -> int:
        """How many times ``path`` was fetched (GET) so far."""
        return self.requests["GET", path]

    def __enter__(self) -> MediaServer:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
