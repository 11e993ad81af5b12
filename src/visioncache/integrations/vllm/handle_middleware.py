"""Image handles in vLLM's OpenAI server: ``--middleware visioncache.integrations.vllm.VisionCacheHandles``.

vLLM adds the class with ``app.add_middleware(VisionCacheHandles)`` after its own middleware, so it
is the outermost: it sees each request first. It

- answers ``POST /v1/visioncache/images`` (one image as the raw body, or JSON ``{"image": ...}`` /
  ``{"images": [...]}`` of base64 ``data:`` URLs or raw base64): each image is bounded, loaded as
  vLLM loads it (a 400 if it does not load), hashed once, kept, and answered with a handle sealed
  under the caller's tenant (`handle_tenants`; a JSON ``"cache_salt"``, else the API key). It runs
  vLLM's API-key check first (the 401 vLLM gives);
- rewrites every other JSON request naming a handle where an image goes: the kept bytes are read,
  checked against the handle's digest, and sent to vLLM as a ``data:`` URL under a server-derived
  ``uuid`` (`handle_rewrite`). A malformed handle is a 400, another tenant's or a forged one a
  404, one whose bytes are gone a 410, in OpenAI's error format;
- refuses (400) any media identifier a client sends (a part's ``uuid``, ``multi_modal_uuids``),
  or with ``VISIONCACHE_HANDLE_CLIENT_UUIDS=scope`` rewrites it under the tenant.

Configured by environment variables, since vLLM passes the class no arguments:
``VISIONCACHE_HANDLE_SECRET`` (keys every tenant's handles), ``VISIONCACHE_HANDLE_CLIENT_UUIDS``
(``refuse``, the default, or ``scope``), ``VISIONCACHE_HANDLE_MAX_BYTES`` (memory for kept bytes,
``512MiB``) and the kept bytes' tiers as ``VISIONCACHE_HANDLE_DISK_DIR``,
``VISIONCACHE_HANDLE_REDIS_URL``, ... (`TierSettings.from_env` with that prefix).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from typing import Any

from visioncache.errors import ConfigurationError
from visioncache.integrations.handles import (
    UPLOAD_PATH,
    DigestedImage,
    HandleError,
    Handles,
    UploadError,
    is_json_request,
    read_body,
    read_upload,
    replay_body,
)
from visioncache.integrations.vllm.handle_rewrite import ClientIdRefusedError, data_url, find, rewrite
from visioncache.integrations.vllm.handle_tenants import Tenant, tenant_of
from visioncache.tiers import TierSettings

__all__ = ["MAX_IMAGE_BYTES", "VisionCacheHandles"]

MAX_IMAGE_BYTES = 20 * 2**20  # an uploaded image, as vllm-mlx bounds a downloaded one
# A body holding none of these names no handle and no identifier. ``\u``: a JSON escape can spell
# a key ("\u0075uid" is "uuid"), so a body with one is parsed whatever it seems to hold.
_MARKERS = (b"visioncache://", b'"uuid"', b'"multi_modal_uuids"', b"\\u")
_GUARDED = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's AuthenticationMiddleware's prefixes


class VisionCacheHandles:
    """ASGI middleware serving image handles in vLLM's OpenAI server (the module docstring says how).

    Args:
        app: the application it wraps (vLLM's, with vLLM's own middleware).
        environ: where the settings are read (the process's environment by default).

    Raises:
        ConfigurationError: a setting that does not parse.
    """

    def __init__(self, app: Any, environ: dict[str, str] | None = None) -> None:
        environ = dict(os.environ if environ is None else environ)
        self.app = app
        mode = environ.get("VISIONCACHE_HANDLE_CLIENT_UUIDS", "refuse").strip().lower() or "refuse"
        if mode not in {"refuse", "scope"}:
            raise ConfigurationError(f"VISIONCACHE_HANDLE_CLIENT_UUIDS must be refuse or scope, got {mode!r}")
        self.scope_client_ids = mode == "scope"
        self.secret = environ.get("VISIONCACHE_HANDLE_SECRET") or None
        tiers = TierSettings.from_env(environ, prefix="VISIONCACHE_HANDLE_")
        max_bytes = environ.get("VISIONCACHE_HANDLE_MAX_BYTES", "512MiB").strip() or "512MiB"
        self.handles = Handles(None, tiers if tiers.configured else None, max_bytes)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path == UPLOAD_PATH:
            await self._upload(scope, receive, send)
            return
        if not is_json_request(scope):  # multipart audio uploads and the like stream through untouched
            await self.app(scope, receive, send)
            return
        messages, body = await read_body(receive)
        replay = replay_body(messages, receive)
        if not any(marker in body for marker in _MARKERS) or not _authorized(scope):
            await self.app(scope, replay, send)  # nothing to do, or vLLM answers 401
            return
        try:
            document = json.loads(body)
        except ValueError:
            await self.app(scope, replay, send)  # vLLM answers malformed JSON itself
            return
        try:
            rewritten = self._rewrite(document, _tenant(scope, document, self.secret))
        except (HandleError, ClientIdRefusedError) as error:
            await _error(error.status, error.code, str(error))(scope, replay, send)
            return
        if rewritten is None:
            await self.app(scope, replay, send)
            return
        await self.app(_with_length(scope, len(rewritten)), replay_body([_request(rewritten)], receive), send)

    def _rewrite(self, document: Any, tenant: Tenant) -> bytes | None:
        """The body vLLM is given (None: unchanged)."""
        found = find(document)
        if not found.handles and not found.client_ids:
            return None
        handles = self.handles.for_tenant(tenant.salt)
        media: dict[str, tuple[str, str]] = {}
        unique = list(dict.fromkeys(found.handles))
        digests = [handles.digest(handle) for handle in unique]  # 400/404 before anything is read
        with handles.held(digests, []) as items:
            for handle, item in zip(unique, items, strict=True):
                assert isinstance(item, DigestedImage)  # no engine cache: verified kept bytes
                media[handle] = (data_url(item.data), tenant.image_id(item.digest))
        rewrite(document, media, tenant.client_id if self.scope_client_ids else None)
        return json.dumps(document).encode()

    async def _upload(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import Request
        from starlette.responses import JSONResponse

        if not _authorized(scope):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            images, _ = await read_upload(request, MAX_IMAGE_BYTES)
            salt = request.headers.get("visioncache-cache-salt")
            answer = self.upload(images, tenant_of(salt, _bearer(scope), self.secret))
        except UploadError as error:
            await _error(error.status, error.code, str(error))(scope, receive, send)
            return
        await JSONResponse(answer)(scope, receive, send)

    def upload(self, images: list[bytes], tenant: Tenant) -> dict[str, Any]:
        """Check that each image loads as vLLM loads it, then hash, keep and seal it for ``tenant``.

        Raises:
            UploadError: an image vLLM cannot load, or one that cannot be kept.
        """
        from vllm.multimodal.media import ImageMediaIO

        for index, image in enumerate(images):
            try:
                ImageMediaIO().load_bytes(image)
            except Exception as error:  # the bytes' own error: PIL raises OSError, ValueError, ...
                raise UploadError(f"image {index} is not an image vLLM can read: {error}") from None
        handles = self.handles.for_tenant(tenant.salt)
        try:
            digests = handles.kept.image_digests(images)
        except Exception as error:
            raise UploadError(f"the images cannot be kept: {error}") from None
        issued = handles.keep([DigestedImage(d, image) for d, image in zip(digests, images, strict=True)])
        return {
            "object": "list",
            "data": [
                {
                    "object": "visioncache.image",
                    "handle": one.handle,
                    "bytes": len(image),
                    "encoded": False,  # vLLM encodes an image when a request first needs it
                    "kept": one.kept,
                    **({} if one.reason is None else {"reason": one.reason}),
                }
                for one, image in zip(issued, images, strict=True)
            ],
        }


def _tenant(scope: Any, document: Any, secret: str | None) -> Tenant:
    salt = document.get("cache_salt") if isinstance(document, dict) else None
    return tenant_of(salt if isinstance(salt, str) else None, _bearer(scope), secret)


def _bearer(scope: Any) -> str | None:
    value = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
    scheme, _, credentials = value.partition(" ")
    return credentials if scheme.lower() == "bearer" and credentials else None


def _authorized(scope: Any) -> bool:
    """vLLM's API-key check (``--api-key`` or ``VLLM_API_KEY``) on a guarded path, as it runs it."""
    app = scope.get("app")
    args = getattr(getattr(app, "state", None), "args", None)
    tokens = [key for key in (getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]) if key]
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    if not tokens or not path.startswith(_GUARDED):
        return True
    given = hashlib.sha256((_bearer(scope) or "").encode()).digest()
    matched = False
    for token in tokens:
        matched |= secrets.compare_digest(given, hashlib.sha256(token.encode()).digest())
    return matched and _bearer(scope) is not None


def _error(status: int, code: str, message: str) -> Any:
    """OpenAI's error format (what the ``openai`` client parses)."""
    from starlette.responses import JSONResponse

    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return JSONResponse(body, status_code=status)


def _with_length(scope: Any, length: int) -> Any:
    headers = [(name, value) for name, value in scope["headers"] if name.lower() != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}


def _request(body: bytes) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": False}
