"""``DELETE /v1/visioncache/images/{handle}``: the caller's tenant forgets an image, everywhere.

The handle is opened under the caller's tenant (another tenant's handle is unknown: 404), and
everything the server keeps for that image under that tenant goes: its features and pixel values
in memory and in every tier (`VisionEmbeddingCache.discard_images`, writes still queued flushed
first), the KV prefixes whose keys hold the image (an image run's ids derive from the namespace,
the tenant, the digest and the run's first position: `kv_keys.image_run_ids`; in the tiers, all
of the tenant's prefixes: `kv_tiers.KVTiers.forget`), and the kept bytes
its handle resolves to. The next request naming the image encodes it again; the handle itself
answers 410 until the image is uploaded again. Other tenants' copies of the same image are not
touched (they are not this tenant's to delete, and their keys cannot be told apart anyway).
"""

from __future__ import annotations

from typing import Any

from visioncache import ContentDigest
from visioncache.integrations.handles import HANDLE_PREFIX
from visioncache.integrations.vllm_mlx.host import ServerHost, tenant_handles
from visioncache.integrations.vllm_mlx.kv_keys import image_run_ids

__all__ = ["forget_image", "forget_kv"]


def forget_kv(prefix_cache: Any, namespace: str, salt: str | None, digest: bytes) -> int:
    """Remove from vllm-mlx's prefix cache (wrapped by `ImageAwarePrefixCache`) every entry whose
    key holds an image run of ``digest`` under (namespace, salt); how many were removed."""
    inner = getattr(prefix_cache, "_inner", prefix_cache)
    entries = getattr(inner, "_entries", None)
    if entries is None:
        return 0
    removed = 0
    for key in list(entries):
        # An image run starts at a negative id after a real token (position 0 may hold the tenant's id).
        starts = [p for p in range(1, len(key)) if key[p] < 0 and (key[p - 1] >= 0 or p == 1)]
        if any(image_run_ids(namespace, salt, digest, start, 1)[0] == key[start] for start in starts):
            removed += int(bool(inner.remove(list(key), include_ssd=True)))
    return removed


def forget_image(installation: ServerHost, handle: str) -> dict[str, Any]:
    """Forget the image ``handle`` names for the caller's tenant; what was removed (raises the
    handle's `HandleError` for a malformed or unknown one)."""
    tenant = installation.request_tenant()
    handles = tenant_handles(installation, tenant)
    if not handle.startswith(HANDLE_PREFIX):
        handle = HANDLE_PREFIX + handle  # the path may carry the token alone
    digest = handles.digest(handle)
    item = [ContentDigest(digest)]
    features = kv = 0
    for state in installation.engines.values():
        features += installation.tenant_state(state, tenant).cache.discard_images(item)
    for prefix_cache in installation.prefix_caches:
        for state in installation.engines.values():
            kv += forget_kv(prefix_cache, state.cache.namespace, tenant, digest)
    for state in installation.engines.values():
        if state.kv_tiers is not None:  # the tenant's prefixes in the tiers (`KVTiers.forget`)
            kv += state.kv_tiers.forget(tenant)
    kept = handles.kept.discard_images(item)
    return {
        "object": "visioncache.image.deleted",
        "handle": handle,
        "deleted": True,
        "features": features,
        "kv_prefixes": kv,
        "kept_bytes": kept,
    }
