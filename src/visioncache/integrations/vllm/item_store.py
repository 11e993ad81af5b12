"""The store both halves of the connector share: scoped encoder-input digests -> encoder outputs.

This is the connector's one adapter to visioncache's core (tiers, keys, serialisation), kept
small so the core can change under it. A key is the digest of what the encoder is given for an
item (`encoder_inputs`) in the item's scope: the namespace of the deployment (`namespace`) in its
current weight epoch, the content digest of a LoRA adapter that reaches the encoder, and the
request's tenant (vLLM's ``cache_salt``, which keys the digest like any visioncache salt: a
tenant's tier keys reveal nothing about its images). Values are the encoder output tensor and the
seconds it cost, stored as safetensors + JSON (bf16 exact, never pickled), checked by a digest or
an HMAC on every read.

Weight epochs. The namespace digests the weight files read at start-up. After the engine's
weights may have changed in place (`engine_events`), `new_epoch` moves every later key to a
namespace of its own, ``<namespace>@weights-epoch/<random>``: nothing stored before is read again,
and nothing computed with the new weights is ever stored where a restarted engine (which loads
the files again) would read it.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from visioncache import CacheStats, ConfigurationError, StoreStats
from visioncache.identity import KeyBuilder
from visioncache.integrations.vllm.config import ConnectorConfig
from visioncache.tiers import ChainStats, TierChain, WritesAtClose

__all__ = ["LEVEL", "ItemStore", "Scope", "build_chain"]

LEVEL = "vllm-ec"
_MAX_BUILDERS = 1024  # key builders kept (one per namespace, adapter and tenant in use)


@dataclass(frozen=True)
class Scope:
    """What besides its encoder input shapes an item's output, or separates who may share it."""

    adapter: str | None = None  # content digest of the LoRA adapter applied to the encoder
    tenant: str | None = None  # the request's cache_salt (a secret: it keys the digest)


def build_chain(config: ConnectorConfig) -> TierChain:
    """The tiers named by ``config`` (`TierSettings.build_chain`: disk first, then Redis/Valkey)."""
    chain = config.tiers.build_chain()
    if chain is None:
        raise ConfigurationError("the connector needs a tier: set 'disk_dir', 'redis_url' or both")
    return chain


class ItemStore:
    """Encoder outputs by scoped encoder-input digest, in the current weight epoch, over a `TierChain`."""

    def __init__(self, chain: TierChain, namespace: str) -> None:
        self.chain = chain
        self.base_namespace = namespace
        self.namespace = namespace  # of the current weight epoch
        self.epoch = 0
        self._builders: OrderedDict[tuple[str, str | None], KeyBuilder] = OrderedDict()
        chain.register_namespace(self._builder(namespace, None).tag, namespace)

    def new_epoch(self) -> str:
        """Move to a fresh namespace (weights may have changed); returns it."""
        self.epoch += 1
        self.namespace = f"{self.base_namespace}@weights-epoch/{secrets.token_hex(16)}"
        return self.namespace

    def scoped_namespace(self, scope: Scope, namespace: str | None = None) -> str:
        """The namespace of ``scope`` (an adapter has one of its own) in ``namespace`` (the
        current epoch's by default)."""
        name = self.namespace if namespace is None else namespace
        return name if scope.adapter is None else f"{name}+adapter/{scope.adapter}"

    def _builder(self, namespace: str, tenant: str | None) -> KeyBuilder:
        builder = self._builders.get((namespace, tenant))
        if builder is None:
            builder = self._builders[(namespace, tenant)] = KeyBuilder(namespace, tenant)
            while len(self._builders) > _MAX_BUILDERS:
                self._builders.popitem(last=False)
        else:
            self._builders.move_to_end((namespace, tenant))
        return builder

    def key(self, digest: bytes, scope: Scope = Scope()) -> tuple[str, str]:
        """The tier key of the input ``digest`` in ``scope`` (current epoch), and its namespace."""
        namespace = self.scoped_namespace(scope)
        return self._builder(namespace, scope.tenant).image_key(LEVEL, digest), namespace

    def tag(self, scope: Scope, namespace: str | None = None) -> str:
        """The 128-bit tag of ``scope``'s keys (it reveals neither the tenant nor the adapter)."""
        return self._builder(self.scoped_namespace(scope, namespace), scope.tenant).tag

    def load(
        self, key: str, *, num_embeds: int | None, dtype: torch.dtype
    ) -> tuple[torch.Tensor, float] | None:
        """The output stored under ``key`` if intact and of the expected length and dtype."""
        entry = self.chain.load_entry(key)
        if entry is None:
            return None
        value, cost = entry
        if not _fits(value, num_embeds, dtype):
            return None
        return value, cost

    def save(self, key: str, namespace: str, output: torch.Tensor, cost: float) -> bool:
        """Queue a host copy of ``output`` under ``key`` (of ``namespace``) for the background
        writer; False if dropped."""
        self.chain.register_namespace(key.partition("/")[0], namespace)
        return self.chain.save_entry(key, output, cost)

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
