"""A KV prefix as the tiers keep it: its key's ids, its tier keys, and its layers as an array tree.

An entry is the KV of one image-aware key (`kv_keys.prefix_key`: namespace, tenant, image
digests and positions are in its ids), stored under ``kv/<tag>/<entry id>``, the tag naming the
namespace and the tenant, the entry id a blake3 digest of the namespace and every id of the key:
never a name. Its value is a
plain tree (the key's ids as int64, then each layer's keys and values at their exact dtype),
written by the tiers' own verified format (`visioncache.tiers`: safetensors behind a blake3 or
HMAC digest of the key and every byte; never pickle).

A tier answers exact keys, and a prompt usually extends a stored key (the next turn of a chat) or
shares only its beginning with one. So each entry is also indexed by every multiple of `BLOCK`
ids of its key: a pointer at ``kvp/<tag>/<chain digest of the first k blocks>`` names
the entry. A prompt asks for the pointers of its own block prefixes (one batched read) and loads
the entry of the longest one found; the engine's own cache then matches the entry's key against
the prompt token by token, as it matches entries it computed.

Only layers of mlx-lm's plain ``KVCache`` are kept (Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's); a
cache with any other kind of layer (rotating, quantized, recurrent) is not written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from blake3 import blake3

from visioncache.integrations.fingerprint import fingerprint
from visioncache.integrations.mlx_vlm import import_mlx

__all__ = [
    "BLOCK",
    "FORMAT",
    "block_digests",
    "cache_from_tree",
    "entry_id",
    "entry_key",
    "namespace_tag",
    "pointer_key",
    "tree_from_cache",
]

BLOCK = 128  # ids per indexed block: a prompt must share one whole block with an entry to find it
FORMAT = "visioncache vllm-mlx KVCache v1"
_ENTRY_DOMAIN = "visioncache vllm-mlx KV entry v1"
_BLOCK_DOMAIN = b"visioncache vllm-mlx KV blocks v1"


def namespace_tag(namespace: str, tenant: str | bytes | None) -> str:
    """The short tag of ``namespace`` and a tenant in tier keys (it reveals neither; the
    namespace's full name goes in the tiers' namespace record): one tenant's prefixes can be
    found, and dropped, without reading any."""
    return "kv" + fingerprint([_ENTRY_DOMAIN, namespace, tenant or b""], hex_chars=32)


def _ids(key: Sequence[int]) -> bytes:
    return np.asarray(key, dtype="<i8").tobytes()


def entry_id(namespace: str, key: Sequence[int]) -> str:
    """The id of the entry of ``key`` (every id of it, and the namespace)."""
    return fingerprint([_ENTRY_DOMAIN, namespace, _ids(key)])


def entry_key(tag: str, entry: str) -> str:
    """The tier key of an entry."""
    return f"kv/{tag}/{entry}"


def pointer_key(tag: str, digest: str) -> str:
    """The tier key of the pointer of a block prefix (`block_digests`)."""
    return f"kvp/{tag}/{digest}"


def block_digests(namespace: str, key: Sequence[int], start: int = 0) -> list[tuple[int, str]]:
    """(length, digest) of each prefix of ``key`` that is a whole number of blocks, from the
    first longer than ``start`` ids on: a chain of blake3 digests, each over the previous one and
    its block's ids (so the key is hashed once, whatever its length)."""
    ids = _ids(key)
    digest = blake3(_BLOCK_DOMAIN + namespace.encode()).digest()
    found = []
    width = 8 * BLOCK
    for blocks in range(1, len(key) // BLOCK + 1):
        digest = blake3(digest + ids[(blocks - 1) * width : blocks * width]).digest()
        if blocks * BLOCK > start:
            found.append((blocks * BLOCK, digest.hex()))
    return found


def _kv_cache_class() -> type[Any]:
    from mlx_lm.models.cache import KVCache  # what vllm-mlx's make_prompt_cache builds

    kv_cache: type[Any] = KVCache
    return kv_cache


def tree_from_cache(key: Sequence[int], cache: Sequence[Any]) -> dict[str, Any] | None:
    """The tree of ``cache`` (one ``KVCache`` per layer, each holding the same number of
    positions, at most ``len(key)``) for ``key``; None if a layer is of another kind."""
    kv_cache = _kv_cache_class()
    layers = []
    offsets = {getattr(layer, "offset", None) for layer in cache}
    if len(offsets) != 1 or not isinstance(offset := offsets.pop(), int) or not 0 < offset <= len(key):
        return None
    for layer in cache:
        if type(layer) is not kv_cache or layer.keys is None:
            return None
        keys, values = layer.state  # sliced to the offset
        layers.append([keys, values])
    if not layers:
        return None
    return {"format": FORMAT, "key": np.asarray(key, dtype=np.int64), "layers": layers}


def cache_from_tree(tree: object, namespace: str, entry: str) -> tuple[tuple[int, ...], list[Any]] | None:
    """The key and layers of a tree read back for ``entry``; None if it is not a well-formed
    entry of this very key (the tiers verified its bytes; this checks what they hold)."""
    if not isinstance(tree, dict) or set(tree) != {"format", "key", "layers"} or tree["format"] != FORMAT:
        return None
    ids, layers = tree["key"], tree["layers"]
    if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
        return None
    if not isinstance(layers, list):
        return None
    key = tuple(int(item) for item in ids.tolist())
    if entry_id(namespace, key) != entry or not layers:
        return None
    kv_cache, mx = _kv_cache_class(), import_mlx()
    cache: list[Any] = []
    for layer in layers:
        if not isinstance(layer, list) or len(layer) != 2:
            return None
        keys, values = layer
        if not (isinstance(keys, mx.array) and isinstance(values, mx.array)):
            return None
        shapes = [tuple(array.shape) for array in (keys, values)]
        if any(len(shape) != 4 for shape in shapes) or shapes[0][:3] != shapes[1][:3]:
            return None
        positions = cache[0].offset if cache else shapes[0][2]  # every layer holds as many
        if shapes[0][2] != positions or not 0 < positions <= len(key):
            return None
        restored = kv_cache()
        restored.keys, restored.values, restored.offset = keys, values, positions
        cache.append(restored)
    return key, cache
