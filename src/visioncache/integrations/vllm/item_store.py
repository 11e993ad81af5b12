"""The store both halves of the connector share: encoder-input digests -> encoder outputs.

This is the connector's one adapter to visioncache's core (tiers, keys, serialisation), kept
small so the core can change under it. A key is the digest of what the encoder is given for an
item (`encoder_inputs`), inside the namespace of the deployment (`namespace`). Values are the
encoder output tensor and the seconds it cost, stored as safetensors + JSON (bf16 exact, never
pickled), checked by a digest or an HMAC on every read.
"""

from __future__ import annotations

from typing import Any

import torch

from visioncache import CacheStats, ConfigurationError, StoreStats
from visioncache.identity import KeyBuilder
from visioncache.integrations.vllm.config import ConnectorConfig
from visioncache.tiers import ChainStats, TierChain, WritesAtClose

__all__ = ["LEVEL", "ItemStore", "build_chain"]

LEVEL = "vllm-ec"


def build_chain(config: ConnectorConfig) -> TierChain:
    """The tiers named by ``config`` (`TierSettings.build_chain`: disk first, then Redis/Valkey)."""
    chain = config.tiers.build_chain()
    if chain is None:
        raise ConfigurationError("the connector needs a tier: set 'disk_dir', 'redis_url' or both")
    return chain


class ItemStore:
    """Encoder outputs by encoder-input digest, in one namespace, over a `TierChain`."""

    def __init__(self, chain: TierChain, namespace: str) -> None:
        self.chain = chain
        self.namespace = namespace
        self._keys = KeyBuilder(namespace)
        chain.register_namespace(self._keys.tag, namespace)

    def key(self, digest: bytes) -> str:
        return self._keys.image_key(LEVEL, digest)

    def load(
        self, digest: bytes, *, num_embeds: int | None, dtype: torch.dtype
    ) -> tuple[torch.Tensor, float] | None:
        """The stored output for the input ``digest`` if intact and of the expected length and dtype."""
        entry = self.chain.load_entry(self.key(digest))
        if entry is None:
            return None
        value, cost = entry
        if not _fits(value, num_embeds, dtype):
            return None
        return value, cost

    def save(self, digest: bytes, output: torch.Tensor, cost: float) -> bool:
        """Queue a host copy of ``output`` for the background writer; False if dropped."""
        return self.chain.save_entry(self.key(digest), output, cost)

    def stats(self) -> ChainStats:
        return self.chain.stats()

    def snapshot(self, *, hits: int, misses: int, encoded: int, seconds_saved: float) -> CacheStats:
        """A visioncache snapshot (one level, ``vllm-ec``, plus the tiers) for
        `visioncache.metrics.register_metrics`."""
        level = StoreStats(hits=hits, misses=misses, computed=encoded, time_saved=seconds_saved)
        return CacheStats(levels={LEVEL: level}, tiers=self.chain.stats())

    def flush(self, timeout: float | None = None) -> bool:
        return self.chain.flush(timeout)

    def close(self, timeout: float | None = None) -> WritesAtClose:
        """Flush for up to ``timeout`` seconds (the chain's exit flush time by default), then close
        (`TierChain.close`: what was dropped, what was still running)."""
        return self.chain.close() if timeout is None else self.chain.close(timeout)


def _fits(value: Any, num_embeds: int | None, dtype: torch.dtype) -> bool:
    """A stored value is served only as the tensor this request's placeholders expect."""
    if not isinstance(value, torch.Tensor) or value.ndim < 1 or value.dtype != dtype:
        return False
    return num_embeds is None or value.shape[0] == num_embeds
