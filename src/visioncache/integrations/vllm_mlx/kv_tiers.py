"""Image-aware KV prefixes in the shared tiers: written behind, restored on a miss (#32).

vllm-mlx keeps KV prefixes in memory only, so a restart (or another server) prefills every
running chat whole again. Here each image-aware KV prefix the engine stores is also written
behind to the tiers the server already has (the disk tier, Redis where configured), in their own
chain: a disk tier in ``<disk_dir>/kv`` bounded by its own budget (``max_kv_bytes``,
least-recently-used entries evicted first, the disk tier's own bound), and Redis keys under
``<redis_prefix>kv:`` within the same budget (`RedisBudget`). When the engine's cache holds less
of a prompt than the tiers may, the longest stored entry sharing a whole block with it
(`kv_blobs`) is read back, checked, and put into the engine's cache; the engine's own lookup then
reuses it exactly as if it had computed it.

Guarantees: entries are keyed by every id of their image-aware key (namespace, tenant, image
digests and positions: `kv_keys`), so nothing is ever reused across models, tenants, images or
positions; every blob is verified before it is parsed (blake3, or HMAC with the tiers' secret:
`visioncache.tiers`), a damaged one is deleted and missed, so it is recomputed, never served;
the disk tier's bytes stay within ``max_kv_bytes`` (plus the disk tier's 1 MiB of SQLite log), and
so do the Redis values under the KV prefix (one server; a cluster: its maxmemory and ttl). An
entry that a longer stored key extends is deleted (as vllm-mlx drops an entry's prefixes from
memory when it stores it): a chat keeps one entry, its latest. A DELETE of an image drops its
tenant's prefixes from the tiers (`KVTiers.forget`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from visioncache import forking
from visioncache.integrations.vllm_mlx.kv_blobs import (
    BLOCK,
    block_digests,
    cache_from_tree,
    entry_id,
    entry_key,
    namespace_tag,
    pointer_key,
    tree_from_cache,
)
from visioncache.tiers import TierChain, TierSettings
from visioncache.trees import parse_byte_size

__all__ = ["KVTierCollector", "KVTierStats", "KVTiers", "build_kv_tiers", "kv_tier_settings"]

logger = logging.getLogger(__name__)

KV_DIRECTORY = "kv"  # under the disk tier's directory: its own diskcache, its own budget
KV_REDIS_PREFIX = "kv:"  # after the Redis tier's prefix
_TRIES = 3  # entries read at most per lookup (a pointer may name an entry evicted since)
_KNOWN_CHATS = 4096  # first blocks whose entries are remembered, to delete the ones a longer key extends
_KNOWN_PER_CHAT = 16


@dataclass
class KVTierStats:
    """What the KV tiers did (updated on the scheduler thread)."""

    kv_tier_writes: int = 0  # entries queued for the tiers
    kv_tier_writes_skipped: int = 0  # entries not written: unsupported layers, or the writer was full
    kv_tier_restores: int = 0  # lookups that put a stored entry into the engine's cache
    kv_tier_tokens_restored: int = 0  # prompt tokens those entries shared with their prompt
    kv_tier_misses: int = 0  # lookups that found no usable entry
    kv_tier_unusable: int = 0  # entries read back intact but not usable (malformed, refused)
    kv_tier_superseded: int = 0  # entries deleted: a longer key extending theirs was written


class KVTiers:
    """The KV chain of one engine namespace (`build_kv_tiers`)."""

    def __init__(self, chain: TierChain, namespace: str, max_bytes: int) -> None:
        self.chain = chain
        self.namespace = namespace
        self.max_bytes = max_bytes
        self.counts = KVTierStats()
        self._tags: dict[str | bytes | None, str] = {}  # by tenant
        self._known: OrderedDict[str, dict[str, int]] = OrderedDict()  # first block -> entry -> length
        self._lock = forking.lock()  # a leaf: only `_known`'s own operations run under it

    def _tag(self, tenant: str | bytes | None) -> str:
        """The tag of this namespace and ``tenant`` in tier keys (its namespace recorded once)."""
        with self._lock:
            tag = self._tags.get(tenant)
            if tag is None:
                tag = self._tags[tenant] = namespace_tag(self.namespace, tenant)
                self.chain.register_namespace(tag, self.namespace)
            return tag

    def save(self, key: Sequence[int], cache: Sequence[Any], tenant: str | bytes | None) -> bool:
        """Write the KV ``cache`` of ``key`` behind (its layers copied to host memory now, on the
        caller's thread, where MLX evaluates them); returns whether it was queued.

        Args:
            key: the image-aware key the engine stored ``cache`` under.
            cache: one layer cache per model layer, holding ``len(key)`` positions.
            tenant: the request's tenant secret (its key's first id derives from it already).
        """
        tree, tag = tree_from_cache(key, cache), self._tag(tenant)
        entry = entry_id(self.namespace, key)
        if tree is None or not self.chain.save_entry(entry_key(tag, entry), tree, 0.0):
            self.counts.kv_tier_writes_skipped += 1
            return False
        blocks = block_digests(self.namespace, key)
        for _, digest in blocks:  # queued after the entry: a pointer never lands before it
            self.chain.save_entry(pointer_key(tag, digest), {"entry": entry, "length": len(key)}, 0.0)
        self.counts.kv_tier_writes += 1
        if blocks:
            for older in self._remember(blocks[0][1], entry, len(key), key):
                self.chain.delete(entry_key(tag, older))
                self.counts.kv_tier_superseded += 1
        return True

    def restore(
        self,
        key: Sequence[int],
        have: int,
        store: Callable[[list[int], list[Any]], bool],
        tenant: str | bytes | None,
    ) -> int:
        """Put into the engine's cache (``store``) the stored entry that shares the most whole
        blocks of ``key``, if that is more than the ``have`` ids the engine's cache shares already.

        Args:
            key: the prompt's image-aware key.
            have: how many of its first ids the engine's cache shares with a stored key.
            store: the engine cache's ``store(key, cache)``; False: it refused the entry.
            tenant: the request's tenant secret.

        Returns:
            How many of ``key``'s first ids the restored entry shares (0: nothing restored).
        """
        blocks = block_digests(self.namespace, key, start=have)
        if not blocks:
            return 0
        tag = self._tag(tenant)
        pointers = self.chain.load_entries([pointer_key(tag, digest) for _, digest in blocks])
        tried: set[str] = set()
        for (length, _), found in reversed(list(zip(blocks, pointers, strict=True))):
            target = found[0] if found is not None else None
            entry = target.get("entry") if isinstance(target, dict) else None
            if not isinstance(entry, str) or entry in tried:
                continue
            tried.add(entry)
            restored = self._load(tag, entry, key, length, store)
            if restored:
                return restored
            if len(tried) >= _TRIES:
                break
        self.counts.kv_tier_misses += 1
        return 0

    def _load(
        self,
        tag: str,
        entry: str,
        key: Sequence[int],
        length: int,
        store: Callable[[list[int], list[Any]], bool],
    ) -> int:
        """Read ``entry`` and give it to ``store``; how many ids of ``key`` it shares (0: none)."""
        loaded = self.chain.load_entry(entry_key(tag, entry))
        if loaded is None:  # evicted since, or damaged (the chain counted and deleted it)
            return 0
        restored = cache_from_tree(loaded[0], self.namespace, entry)
        if restored is None or tuple(restored[0][:length]) != tuple(key[:length]):
            self.counts.kv_tier_unusable += 1
            return 0
        stored_key, cache = restored
        if not store(list(stored_key), cache):
            self.counts.kv_tier_unusable += 1
            return 0
        shared = length
        for mine, theirs in zip(key[length:], stored_key[length:], strict=False):
            if mine != theirs:
                break
            shared += 1
        self.counts.kv_tier_restores += 1
        self.counts.kv_tier_tokens_restored += shared
        first = block_digests(self.namespace, stored_key[:BLOCK])[0][1]
        self._remember(first, entry, len(stored_key), stored_key)
        return shared

    def _remember(self, first: str, entry: str, length: int, key: Sequence[int]) -> list[str]:
        """Note ``entry`` (of ``key``) under its first block; the entries it extends, forgotten."""
        with self._lock:
            known = self._known.setdefault(first, {})
            self._known.move_to_end(first)
            candidates = [(other, size) for other, size in known.items() if size < length and other != entry]
        extended = [other for other, size in candidates if entry_id(self.namespace, key[:size]) == other]
        with self._lock:
            for other in extended:
                known.pop(other, None)
            known[entry] = length
            while len(known) > _KNOWN_PER_CHAT:
                known.pop(next(iter(known)))
            while len(self._known) > _KNOWN_CHATS:
                self._known.popitem(last=False)
        return extended

    def forget(self, tenant: str | bytes | None, timeout: float = 30.0) -> int:
        """Drop every prefix of ``tenant`` in this namespace from every tier (queued writes
        flushed first), for a DELETE of one of its images: the tiers cannot tell which prefixes
        hold the image without reading them all, so the tenant's next turns prefill whole once.

        Args:
            tenant: the tenant secret whose prefixes go.
            timeout: seconds to wait for queued writes first.

        Returns:
            How many stored prefixes (not counting their block pointers) were removed.
        """
        self.chain.flush(timeout)
        tag = self._tag(tenant)
        prefixes = (entry_key(tag, ""), pointer_key(tag, ""))
        removed = 0
        for tier in self.chain.tiers:
            try:
                stored = list(tier.keys())
                names = [name for name in stored if name.startswith(prefixes)]
                for name in names:
                    tier.delete(name)
            except Exception as error:  # a tier down: its copies stay (they age out by LRU or TTL)
                logger.warning("KV tier %s: could not drop a tenant's prefixes: %r", tier.name, error)
                continue
            removed += sum(name.startswith(prefixes[0]) for name in names)
        with self._lock:
            self._known.clear()
        return removed

    def stats(self) -> dict[str, int]:
        """The counters, plus the tiers': bytes and entries of the disk tier (0 without one), its
        budget, damaged blobs found (deleted) and writes still queued."""
        chain = self.chain.stats()
        disk = next((row for row in chain.tiers if row.name == "disk"), None)
        result = asdict(self.counts)
        result["kv_tier_corrupt"] = sum(row.corrupt for row in chain.tiers)
        result["kv_tier_bytes"] = (disk.bytes or 0) if disk is not None else 0
        result["kv_tier_entries"] = (disk.entries or 0) if disk is not None else 0
        result["kv_tier_max_bytes"] = self.max_bytes
        result["kv_tier_writes_pending"] = chain.writes_pending
        return result

    def close(self) -> None:
        """Flush queued writes, then close the tiers."""
        self.chain.close()


def kv_tier_settings(tiers: TierSettings, max_bytes: int) -> TierSettings | None:
    """The KV chain's settings: ``tiers`` with the disk tier in its ``kv`` folder bounded by
    ``max_bytes``, and Redis keys under their own prefix bounded by ``max_bytes`` too (one
    server; a cluster by its own bounds); None: no tier, or ``max_bytes`` 0."""
    if not tiers.configured or max_bytes == 0:
        return None
    disk = os.path.join(tiers.disk_dir, KV_DIRECTORY) if tiers.disk_dir is not None else None
    redis_budget = max_bytes if tiers.redis_url is not None and not tiers.redis_cluster else None
    if tiers.redis_url is not None and tiers.redis_cluster:
        logger.warning(
            "visioncache: KV prefixes in a Redis Cluster are bounded by its maxmemory and "
            "--vision-cache-redis-ttl only (a byte budget needs one server)"
        )
    return dataclasses.replace(
        tiers,
        disk_dir=disk,
        disk_max_bytes=max_bytes if disk is not None else None,
        redis_prefix=tiers.redis_prefix + KV_REDIS_PREFIX,
        redis_max_bytes=redis_budget,
    )


def build_kv_tiers(tiers: TierSettings, max_kv_bytes: str | int, namespace: str) -> KVTiers | None:
    """The KV tiers of an engine namespace (None: no tier configured, or a budget of 0)."""
    max_bytes = parse_byte_size(max_kv_bytes, name="max_kv_bytes") or 0
    settings = kv_tier_settings(tiers, max_bytes)
    chain = settings.build_chain() if settings is not None else None
    return KVTiers(chain, namespace, max_bytes) if chain is not None else None


_COUNTER_HELP = {
    "kv_tier_writes": "KV prefixes written behind to the tiers",
    "kv_tier_writes_skipped": "KV prefixes not written (unsupported layers, or the tier writer was full)",
    "kv_tier_restores": "KV prefixes read back from the tiers into the engine's cache",
    "kv_tier_tokens_restored": "Prompt tokens the KV prefixes read back shared with their prompt",
    "kv_tier_misses": "KV lookups in the tiers that found no usable prefix",
    "kv_tier_unusable": "KV prefixes read back intact but not usable",
    "kv_tier_superseded": "KV prefixes deleted from the tiers: a longer key extending theirs was written",
    "kv_tier_corrupt": "Damaged KV blobs found in the tiers (deleted, recomputed)",
}
_GAUGE_HELP = {
    "kv_tier_bytes": "Bytes of the KV disk tier",
    "kv_tier_entries": "Entries of the KV disk tier (prefixes and their block pointers)",
    "kv_tier_max_bytes": "Budget of the KV disk tier (--vision-cache-max-kv-bytes)",
    "kv_tier_writes_pending": "KV writes queued for the tiers",
}


class KVTierCollector:
    """`KVTiers.stats` on vllm-mlx's ``/metrics`` (``visioncache_vllm_mlx_kv_tier_*``), read at scrape."""

    def __init__(self, tiers: KVTiers, prefix: str = "visioncache_vllm_mlx") -> None:
        self._tiers = tiers
        self._prefix = prefix

    def describe(self) -> list[Any]:
        return []  # nothing to read at registration time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self._tiers.stats()
        for name, help in _COUNTER_HELP.items():
            yield CounterMetricFamily(f"{self._prefix}_{name}", help, value=stats[name])
        for name, help in _GAUGE_HELP.items():
            yield GaugeMetricFamily(f"{self._prefix}_{name}", help, value=stats[name])
