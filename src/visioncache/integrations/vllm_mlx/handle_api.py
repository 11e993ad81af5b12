"""The HTTP side of image handles in vllm-mlx's OpenAI server (a FastAPI app).

- ``POST /v1/visioncache/images`` (`UPLOAD_PATH`) takes one image as the raw request body (any
  content type but JSON; ``?encode=false`` to skip encoding), or JSON ``{"image": ...}`` /
  ``{"images": [...]}`` of base64 ``data:`` URLs or raw base64 (with ``"encode": false``), keeps
  each image's bytes, encodes it ahead of use (once the engine has started), and answers
  ``{"object": "list", "data": [{"object": "visioncache.image", "handle": "visioncache://...",
  "bytes": n, "encoded": true, "kept": true}]}`` (``"reason"`` beside ``"kept": false``). It
  takes vllm-mlx's own API-key check.
- ``DELETE /v1/visioncache/images/{handle}`` forgets the image for the caller's tenant: its
  features, KV prefixes and kept bytes (`forget`); 404 for a handle the tenant was not given.
- Every other JSON POST whose body names a handle where an image goes (``url``, ``image_url`` or
  ``image``) is checked before vllm-mlx sees it: its API key first (vllm-mlx's check, so nothing
  is learned without it), then each handle: 400 malformed, 404 unknown (forged, guessed,
  another tenant's), 410 expired (neither features nor bytes held: send the image again), in
  OpenAI's error format. A request that passes holds its handles open (`Handles.held_open`): each
  opened once, its features pinned (else its kept bytes read, verified and held), so what was
  checked still holds when its scheduler step resolves it, and is not opened or read again.
- Videos (`video_handles`): ``POST /v1/visioncache/videos`` and ``DELETE .../videos/{handle}``
  likewise; a handle where a video goes (under ``video_url`` or ``video``) is replaced, after the
  same checks, by its kept bytes as a ``data:video/...`` URL, for vllm-mlx's own video path. A
  handle of the other kind is a 400 ``wrong_handle_kind``.

Only ``vllm_mlx.server``'s ``app``, ``security`` and ``verify_api_key`` are used (seams in
`compat.SEAMS`); the engine meets handles through the existing seams (`images.resolve_images`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

from visioncache import ConfigurationError
from visioncache.integrations.handles import (
    HandleError,
    MediaKind,
    is_handle,
    is_json_request,
    read_body,
    replay_body,
)
from visioncache.integrations.vllm_mlx.compat import checked_module
from visioncache.integrations.vllm_mlx.forget import forget_image
from visioncache.integrations.vllm_mlx.host import ServerHost, tenant_handles
from visioncache.integrations.vllm_mlx.uploads import UPLOAD_PATH, UploadError, read_upload, upload
from visioncache.integrations.vllm_mlx.video_handles import (
    VIDEO_UPLOAD_PATH,
    forget_video,
    inline_videos,
    read_video_upload,
    upload_videos,
)

__all__ = ["UPLOAD_PATH", "HandleMiddleware", "mount"]

_IMAGE_KEYS = frozenset({"url", "image_url", "image"})
_VIDEO_KEYS = frozenset({"video_url", "video"})
_MARKER = b"visioncache://"


def mount(app: Any, installation: ServerHost) -> None:
    """Add the upload route and the handle check to vllm-mlx's ``app`` (before it starts).

    Raises ConfigurationError when vllm-mlx's server lacks what is used (nothing is added then).
    """
    from fastapi import Depends, Request
    from fastapi.responses import JSONResponse

    server = checked_module("vllm_mlx.server")

    if not hasattr(app, "add_api_route") or not hasattr(app, "add_middleware"):  # seams checked above
        raise ConfigurationError(
            "vllm-mlx's server lacks a FastAPI app: image handles cannot be served "
            "(--vision-cache-no-handles serves without them)"
        )

    async def upload_images(request: Request) -> JSONResponse:
        try:
            images, encode = await read_upload(request)
            return JSONResponse(upload(installation, images, encode=encode))
        except (UploadError, HandleError) as error:
            return JSONResponse(error_body(error), status_code=error.status)

    async def delete_image(handle: str) -> JSONResponse:
        try:
            return JSONResponse(forget_image(installation, handle))
        except HandleError as error:
            return JSONResponse(error_body(error), status_code=error.status)

    async def upload_video(request: Request) -> JSONResponse:
        try:
            return JSONResponse(upload_videos(installation, await read_video_upload(request)))
        except (UploadError, HandleError) as error:
            return JSONResponse(error_body(error), status_code=error.status)

    async def delete_video(handle: str) -> JSONResponse:
        try:
            return JSONResponse(forget_video(installation, handle))
        except HandleError as error:
            return JSONResponse(error_body(error), status_code=error.status)

    # FastAPI reads the annotations; under postponed evaluation they are strings naming local imports.
    for uploading in (upload_images, upload_video):
        uploading.__annotations__ = {"request": Request, "return": JSONResponse}
    for deleting in (delete_image, delete_video):
        deleting.__annotations__ = {"handle": str, "return": JSONResponse}

    checked = [Depends(server.verify_api_key)]  # the tenants' check where they are configured
    app.add_api_route(UPLOAD_PATH, upload_images, methods=["POST"], dependencies=checked)
    app.add_api_route(UPLOAD_PATH + "/{handle:path}", delete_image, methods=["DELETE"], dependencies=checked)
    app.add_api_route(VIDEO_UPLOAD_PATH, upload_video, methods=["POST"], dependencies=checked)
    app.add_api_route(
        VIDEO_UPLOAD_PATH + "/{handle:path}", delete_video, methods=["DELETE"], dependencies=checked
    )
    app.add_middleware(HandleMiddleware, installation=installation)


def error_body(error: UploadError | HandleError) -> dict[str, Any]:
    """OpenAI's error format (what the ``openai`` client parses)."""
    return {"error": {"message": str(error), "type": "invalid_request_error", "code": error.code}}


def handle_urls(body: bytes) -> list[str]:
    """The handles a JSON request body names where an image goes (none if it is not JSON)."""
    return [url for url, kind in media_handles(body) if kind == "image"]


def media_handles(body: bytes) -> list[tuple[str, MediaKind]]:
    """The handles a JSON request body names where an image or a video goes, with which (none if
    it is not JSON): under ``video_url`` or ``video`` a video, under ``url``, ``image_url`` or
    ``image`` elsewhere an image."""
    if _MARKER not in body:  # the common case: one scan, no parse
        return []
    try:
        document = json.loads(body)
    except ValueError:
        return []  # vllm-mlx answers malformed JSON itself
    return list(_walk(document, None))


def _slot(key: str, parent: MediaKind | None) -> MediaKind | None:
    if key in _VIDEO_KEYS or (parent == "video" and key == "url"):
        return "video"
    return "image" if key in _IMAGE_KEYS else None


def _walk(node: Any, slot: MediaKind | None) -> Iterator[tuple[str, MediaKind]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, _slot(key, slot))
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value, slot)
    elif slot is not None and is_handle(node):
        yield node, slot


class HandleMiddleware:
    """ASGI middleware: checks the handles of a request before vllm-mlx's app sees it."""

    def __init__(self, app: Any, installation: ServerHost) -> None:
        self.app = app
        self.installation = installation

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] in (UPLOAD_PATH, VIDEO_UPLOAD_PATH)
            or not is_json_request(scope)  # multipart audio uploads and the like stream through untouched
        ):
            await self.app(scope, receive, send)
            return
        messages, body = await read_body(receive)
        replay = replay_body(messages, receive)
        found = media_handles(body)
        if not found:
            await self.app(scope, replay, send)
            return
        from starlette.requests import Request
        from starlette.responses import JSONResponse

        denied = await _authorization_error(Request(scope), self.installation.verify_api_key)
        if denied is not None:
            await denied(scope, replay, send)
            return
        installation = self.installation
        tenant = installation.request_tenant()
        handles = tenant_handles(installation, tenant)
        if any(kind == "video" for _, kind in found):
            try:  # a video's handle becomes its kept bytes, for vllm-mlx's own video path
                body = inline_videos(body, handles)
            except HandleError as error:
                await JSONResponse(error_body(error), status_code=error.status)(scope, replay, send)
                return
            scope = _with_length(scope, len(body))
            replay = replay_body([{"type": "http.request", "body": body, "more_body": False}], receive)
        urls = [url for url, kind in found if kind == "image"]
        engines = [installation.tenant_state(state, tenant).cache for state in installation.engines.values()]
        with ExitStack() as held:
            try:
                held.enter_context(handles.held_open(urls, engines))
            except HandleError as error:
                await JSONResponse(error_body(error), status_code=error.status)(scope, replay, send)
                return
            await self.app(scope, replay, send)


def _with_length(scope: Any, length: int) -> Any:
    """``scope`` with its ``content-length`` header saying ``length`` (a rewritten body's)."""
    headers = [pair for pair in scope.get("headers") or [] if pair[0].lower() != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode("ascii"))]}


async def _authorization_error(request: Any, verify: Any = None) -> Any:
    """The server's API-key check, as its routes run it (vllm-mlx's own, or ``verify``: the
    tenants' keys): None, or the response it gives."""
    from fastapi import HTTPException
    from starlette.responses import JSONResponse

    server = checked_module("vllm_mlx.server")

    try:
        await (verify or server.verify_api_key)(await server.security(request))
    except HTTPException as error:
        return JSONResponse({"detail": error.detail}, status_code=error.status_code, headers=error.headers)
    return None
