"""Tenants chosen per request by API key: which secret keys a request's features, KV and handles.

``--vision-cache-tenants-file FILE`` or ``--vision-cache-tenants-env NAME`` (a variable holding
the same text) maps each API key to its tenant's secret, as a JSON object ``{"<api key>":
"<tenant secret>", ...}`` (two keys may share one tenant). Secrets never go on a command line.
With a map, the server's API keys are the map's: a request whose bearer key is not in it gets
stock vllm-mlx's 401 (the same ``detail``), on every route vllm-mlx protects and on visioncache's
own; ``--api-key`` cannot be given as well. Each request then runs as its key's tenant: its
images' features and pixel values are keyed under the tenant's secret (`VisionEmbeddingCache.with_salt`,
one bounded cache for all tenants), its KV prefix ids (image runs and the first id of every key)
derive from it, and its image handles are sealed and kept under it. Tenants share nothing, so a
tenant's first request for an image another tenant sent costs an encode, as on a server of its own.

``--vision-cache-salt`` is the one-tenant case: every request is that tenant's. Without either,
every client shares one cache; with a shared tier (Redis, or a disk directory other servers may
use) the server says so once at start-up (`warn_if_shared`).

How a request's tenant reaches the engine: an ASGI middleware (`TenantMiddleware`) reads the
bearer key and sets `current` for the request's handling; vllm-mlx's ``MLLMScheduler.add_request``
runs in it (patched to note the request id's tenant, `Installation.note_request`), and the
scheduler step reads the note back by request id.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from visioncache.errors import ConfigurationError
from visioncache.integrations.vllm_mlx.compat import checked_module

__all__ = ["NO_TENANT", "TenantKeys", "TenantMiddleware", "current", "mount", "verifier", "warn_if_shared"]

logger = logging.getLogger(__name__)


class _NoTenant:
    """The tenant of a request no API key named (health checks, the engine's own warm-up)."""

    def __repr__(self) -> str:
        return "NO_TENANT"


NO_TENANT = _NoTenant()
# The tenant secret of the request being handled; NO_TENANT outside a keyed request.
current: ContextVar[str | _NoTenant] = ContextVar("visioncache_tenant", default=NO_TENANT)


@dataclass(frozen=True)
class TenantKeys:
    """API key -> tenant secret (`from_text`), with a lookup that takes the same time for every key."""

    secrets: Mapping[str, str]

    @classmethod
    def from_text(cls, text: str, source: str) -> TenantKeys:
        try:
            document = json.loads(text)
        except ValueError as error:
            raise ConfigurationError(f"{source}: not JSON ({error})") from None
        if not isinstance(document, dict) or not document:
            raise ConfigurationError(
                f'{source}: expected a JSON object {{"<api key>": "<tenant secret>", ...}}'
            )
        for key, secret in document.items():
            if not key or not isinstance(secret, str) or not secret:
                raise ConfigurationError(
                    f"{source}: every API key needs a non-empty tenant secret (a string)"
                )
        return cls(dict(document))

    @classmethod
    def from_file(cls, path: str) -> TenantKeys:
        try:
            text = Path(path).read_text()
        except OSError as error:
            raise ConfigurationError(f"--vision-cache-tenants-file {path!r}: {error}") from None
        return cls.from_text(text, f"--vision-cache-tenants-file {path!r}")

    @classmethod
    def from_env(cls, name: str) -> TenantKeys:
        text = os.environ.get(name, "")
        if not text:
            raise ConfigurationError(
                f"--vision-cache-tenants-env names {name!r}, but that environment variable is unset or empty"
            )
        return cls.from_text(text, f"the variable {name!r} (--vision-cache-tenants-env)")

    def secret_of(self, api_key: str) -> str | None:
        """The tenant secret of ``api_key``, or None; every key is compared, in constant time."""
        found = None
        for key, secret in self.secrets.items():
            if hmac.compare_digest(key.encode(), api_key.encode()):
                found = secret
        return found


def _bearer(headers: Any) -> str | None:
    value = dict(headers or []).get(b"authorization", b"").decode("latin-1")
    scheme, _, credentials = value.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


class TenantMiddleware:
    """ASGI middleware: the request's tenant (from its bearer key) is `current` while it is handled."""

    def __init__(self, app: Any, tenants: TenantKeys) -> None:
        self.app = app
        self.tenants = tenants

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = _bearer(scope.get("headers"))
        secret = self.tenants.secret_of(key) if key is not None else None
        token = current.set(NO_TENANT if secret is None else secret)
        try:
            await self.app(scope, receive, send)
        finally:
            current.reset(token)


def verifier(tenants: TenantKeys) -> Any:
    """A replacement for vllm-mlx's ``verify_api_key`` dependency: a key of the map passes, any
    other request gets the 401 stock gives (``API key required`` / ``Invalid API key``)."""
    from fastapi import Depends, HTTPException

    server = checked_module("vllm_mlx.server")

    async def verify_tenant_key(credentials: Any = Depends(server.security)) -> bool:  # noqa: B008
        if credentials is None:
            raise HTTPException(status_code=401, detail="API key required")
        if tenants.secret_of(credentials.credentials) is None:
            raise HTTPException(status_code=401, detail="Invalid API key")
        return True

    return verify_tenant_key


def mount(app: Any, tenants: TenantKeys) -> Any:
    """Serve ``tenants`` on vllm-mlx's ``app`` (before it starts): the tenants' keys replace
    vllm-mlx's API-key check on every route (FastAPI's dependency override), and each request is
    handled as its key's tenant (`TenantMiddleware`, outermost: mount it last). Returns the check
    that replaced vllm-mlx's (the handle routes run it too)."""
    server = checked_module("vllm_mlx.server")

    check = verifier(tenants)
    app.dependency_overrides[server.verify_api_key] = check
    app.add_middleware(TenantMiddleware, tenants=tenants)
    return check


def warn_if_shared(shared_tier: bool, tenants: TenantKeys | None, salt: str | None) -> None:
    """Say plainly, once at start-up, that every client shares one cache, when a shared tier
    makes that visible beyond this process."""
    if shared_tier and tenants is None and salt is None:
        logger.warning(
            "visioncache: ALL CLIENTS SHARE ONE CACHE. No tenant is configured and the cache has a "
            "shared tier (Redis, or a disk directory other servers may use): any client can learn "
            "whether another sent an image (a hit answers sooner than an encode), here, after a "
            "restart and on every server of that tier. Map API keys to tenants with "
            "--vision-cache-tenants-file or --vision-cache-tenants-env (or one tenant: "
            "--vision-cache-salt-env)."
        )
