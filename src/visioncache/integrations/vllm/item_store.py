"""The store both halves of the connector share: vLLM item identifiers -> encoder outputs.

This is the connector's one adapter to visioncache's core (tiers, keys, serialisation), kept
small so the core can change under it. A key is the item's identifier (vLLM's ``mm_hash``, LoRA
prefix included) as a `visioncache.ContentId`, inside the namespace of the deployment (`namespace`).
Values are the encoder output tensor and the seconds it cost, stored as safetensors + JSON
(bf16 exact, never pickled), checked by a digest or an HMAC on every read.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from visioncache import CacheStats, ConfigurationError, ContentId, StoreStats, compute_image_hash
from visioncache.identity import MAX_CONTENT_ID_CHARS, KeyBuilder
from visioncache.integrations.vllm.config import ConnectorConfig
from visioncache.tiers import ChainStats, TierChain

__all__ = ["LEVEL", "ItemStore", "build_chain", "is_engine_hash"]

LEVEL = "vllm-ec"
# vLLM's own item hashes: hex blake3/sha256 (64) or sha512 (128), after an optional "lora_name:".
_ENGINE_HASH = re.compile(r"(?:[^:]+:)?(?:[0-9a-f]{64}|[0-9a-f]{128})")


def is_engine_hash(identifier: str) -> bool:
    """Whether ``identifier`` is a content hash vLLM computed (not a client's multi_modal_uuid)."""
    return _ENGINE_HASH.fullmatch(identifier) is not None


def build_chain(config: ConnectorConfig) -> TierChain:
    """The tiers named by ``config`` (`TierSettings.build_chain`: disk first, then Redis/Valkey)."""
    chain = config.tiers.build_chain()
    if chain is None:
        raise ConfigurationError("the connector needs a tier: set 'disk_dir', 'redis_url' or both")
    return chain


class ItemStore:
    """Encoder outputs by vLLM item identifier, in one namespace, over a `TierChain`."""

    def __init__(self, chain: TierChain, namespace: str, *, trust_client_uuids: bool = False) -> None:
        self.chain = chain
        self.namespace = namespace
        self._keys = KeyBuilder(namespace)
        self._trust_client_uuids = trust_client_uuids
        chain.register_namespace(self._keys.tag, namespace)

    def cacheable(self, identifier: str) -> bool:
        """Client-chosen identifiers name content only by the client's word: skipped unless trusted."""
        if len(identifier) > MAX_CONTENT_ID_CHARS or not identifier.strip():
            return False
        return self._trust_client_uuids or is_engine_hash(identifier)

    def key(self, identifier: str) -> str:
        """vLLM's identifier is an ID for content vLLM hashed: visioncache's `ContentId`, whose
        digest has a domain of its own (it never equals the digest of any bytes, file or URL)."""
        digest = bytes.fromhex(compute_image_hash(ContentId(identifier)))
        return self._keys.image_key(LEVEL, digest)

    def load(
        self, identifier: str, *, num_embeds: int | None, dtype: torch.dtype
    ) -> tuple[torch.Tensor, float] | None:
        """The stored output of ``identifier`` if intact and of the expected length and dtype."""
        entry = self.chain.load_entry(self.key(identifier))
        if entry is None:
            return None
        value, cost = entry
        if not _fits(value, num_embeds, dtype):
            return None
        return value, cost

    def save(self, identifier: str, output: torch.Tensor, cost: float) -> bool:
        """Queue a host copy of ``output`` for the background writer; False if dropped."""
        return self.chain.save_entry(self.key(identifier), output, cost)

    def stats(self) -> ChainStats:
        return self.chain.stats()

    def snapshot(self, *, hits: int, misses: int, encoded: int, seconds_saved: float) -> CacheStats:
        """A visioncache snapshot (one level, ``vllm-ec``, plus the tiers) for
        `visioncache.metrics.register_metrics`."""
        level = StoreStats(hits=hits, misses=misses, computed=encoded, time_saved=seconds_saved)
        return CacheStats(levels={LEVEL: level}, tiers=self.chain.stats())

    def flush(self, timeout: float | None = None) -> bool:
        return self.chain.flush(timeout)

    def close(self) -> None:
        self.chain.close()


def _fits(value: Any, num_embeds: int | None, dtype: torch.dtype) -> bool:
    """A stored value is served only as the tensor this request's placeholders expect."""
    if not isinstance(value, torch.Tensor) or value.ndim < 1 or value.dtype != dtype:
        return False
    return num_embeds is None or value.shape[0] == num_embeds
