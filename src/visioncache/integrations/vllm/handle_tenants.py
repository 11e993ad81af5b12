"""Who a request to vLLM's OpenAI server is, for image handles, and the identifiers the server gives
its media items.

A request's tenant is its ``cache_salt`` when it sends one (vLLM's per-request secret, which also
scopes its prefix cache and the connector's entries: docs/vllm.md), else its API key (the bearer
token), else the server's one tenant. Each tenant seals and keeps its handles under a salt of its
own (`Handles.for_tenant`), so one tenant's handle is unknown (404) to every other. With
``VISIONCACHE_HANDLE_SECRET`` every tenant's salt is keyed by that secret as well, so even the
one tenant's handles cannot be made by anyone holding the image.

The identifier the server puts on a media part (vLLM's ``uuid``, the item's name in vLLM's
processor cache, encoder cache and prefix-cache keys) is derived here, never taken from the client:
``vc-image-<hex>`` from the tenant and the verified content digest of a handle's image, and, where
client ``uuid`` s are scoped, ``vc-client-<hex>`` from the tenant and the client's word. The two
spellings cannot meet each other nor a content hash vLLM computes (64 hex characters), and a
client's word names an item of its own tenant only.
"""

from __future__ import annotations

from dataclasses import dataclass

from blake3 import blake3

__all__ = ["Tenant", "tenant_of"]

_ID_CONTEXT = "visioncache vllm media identifier v1"


@dataclass(frozen=True)
class Tenant:
    """A request's tenant: the salt its handles are sealed and kept under (None: the public one)."""

    salt: str | None

    def _key(self) -> bytes:
        material = b"\x00" if self.salt is None else b"\x01" + self.salt.encode("utf-8")
        key: bytes = blake3(material, derive_key_context=_ID_CONTEXT).digest()
        return key

    def image_id(self, digest: bytes) -> str:
        """vLLM's ``uuid`` for the image whose verified content digest is ``digest``."""
        return "vc-image-" + blake3(b"image\x00" + digest, key=self._key()).hexdigest()

    def client_id(self, uuid: str) -> str:
        """A client's ``uuid``, scoped under this tenant (it can name this tenant's items only)."""
        return "vc-client-" + blake3(b"client\x00" + uuid.encode("utf-8"), key=self._key()).hexdigest()


def tenant_of(cache_salt: str | None, api_key: str | None, secret: str | None) -> Tenant:
    """The tenant of a request with ``cache_salt`` and bearer ``api_key`` (either None), on a
    server whose handle secret is ``secret``: a tenant per salt, else per key, else one."""
    if cache_salt is not None:
        identity = "cache_salt\x00" + cache_salt
    elif api_key is not None:
        identity = "api_key\x00" + api_key
    else:
        return Tenant(secret)
    return Tenant(identity + "\x00" + (secret or ""))
