"""Reading an ASGI request's body ahead of the application, and giving it back, for the handle
middleware of every engine's server."""

from __future__ import annotations

from typing import Any

__all__ = ["is_json_request", "read_body", "replay_body"]


def is_json_request(scope: Any) -> bool:
    """A JSON body, as FastAPI reads one: a JSON content type, or none at all."""
    content_type = dict(scope.get("headers") or []).get(b"content-type")
    return content_type is None or b"json" in content_type.lower()


async def read_body(receive: Any) -> tuple[list[Any], bytes]:
    """Every ``http.request`` message of the body, and the body."""
    messages, chunks = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return messages, b"".join(chunks)


def replay_body(messages: list[Any], receive: Any) -> Any:
    """A ``receive`` that gives ``messages`` again, then defers to the real one (disconnects)."""
    pending = list(messages)

    async def replay() -> Any:
        return pending.pop(0) if pending else await receive()

    return replay
