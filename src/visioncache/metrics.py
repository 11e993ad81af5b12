"""Prometheus metrics for a cache: a collector that reads ``cache.get_stats()`` at scrape time.

The cache's own counters are the single source of truth: nothing is incremented twice, and a
scrape shows exactly what ``get_stats()`` shows. Exposed, per level (pixel, pixel_only, encoding,
embedding): hits, misses, evictions, rejections, time saved (counters) and entries, bytes
(gauges); per shared tier: hits, misses, errors, corrupt entries and writes; and the total
seconds of work saved. Missing keys are skipped, so a cache without some level or without tiers
still scrapes cleanly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, TypeGuard

from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["LEVELS", "VisionCacheCollector", "register_metrics"]

LEVELS = ("pixel", "pixel_only", "encoding", "embedding")
# (metric name suffix, stats key, help, kind)
_Spec = tuple[str, str, str, str]
_LEVEL_METRICS: tuple[_Spec, ...] = (
    ("cache_hits", "cache_hits", "Lookups answered from the cache", "counter"),
    ("cache_misses", "cache_misses", "Lookups the cache could not answer", "counter"),
    ("cache_evictions", "cache_evictions", "Entries evicted to make room", "counter"),
    ("cache_rejections", "cache_rejections", "Values too large to store", "counter"),
    ("time_saved_seconds", "time_saved", "Seconds of recorded work hits avoided", "counter"),
    ("cache_entries", "cache_size", "Entries held", "gauge"),
    ("cache_bytes", "cache_bytes", "Bytes held (sum of array nbytes)", "gauge"),
)
_TIER_METRICS: tuple[_Spec, ...] = (
    ("tier_hits", "hits", "Shared-tier lookups answered", "counter"),
    ("tier_misses", "misses", "Shared-tier lookups not answered", "counter"),
    ("tier_errors", "errors", "Shared-tier operations that failed (skipped, not raised)", "counter"),
    ("tier_corrupt", "corrupt", "Corrupt or forged shared-tier entries deleted", "counter"),
    ("tier_writes", "writes", "Blobs written to a shared tier", "counter"),
    ("tier_entries", "entries", "Entries a shared tier holds", "gauge"),
    ("tier_bytes", "bytes", "Bytes a shared tier holds", "gauge"),
)

# (stats key under tiers["chain"], kind, help)
_CHAIN_METRICS: tuple[tuple[str, str, str], ...] = (
    ("writes_pending", "gauge", "Background tier writes queued"),
    ("writes_dropped", "counter", "Background tier writes dropped because the queue was full"),
    ("unserializable", "counter", "Values not written to shared tiers because they cannot be serialised"),
)


class StatsSource(Protocol):
    def get_stats(self) -> Mapping[str, Any]: ...


class VisionCacheCollector(Collector):
    """Turns one ``get_stats()`` snapshot into metric families at every scrape."""

    def __init__(self, cache: StatsSource, *, prefix: str = "visioncache") -> None:
        self._cache = cache
        self._prefix = prefix

    def describe(self) -> list[Metric]:
        # Returning nothing tells the registry not to call `collect` at registration time, which
        # would read the cache's stats before the caller has finished setting it up.
        return []

    def collect(self) -> Iterator[Metric]:
        stats = self._cache.get_stats()
        levels = {level: {key: stats.get(f"{level}_{key}") for _, key, _, _ in _LEVEL_METRICS}
                  for level in LEVELS}  # fmt: skip
        yield from self._families(_LEVEL_METRICS, "level", levels)
        total = stats.get("total_time_saved")
        if _is_number(total):
            yield CounterMetricFamily(
                f"{self._prefix}_total_time_saved_seconds",
                "Seconds of preprocessing and encoding that cache hits avoided, all levels",
                value=float(total),
            )
        tiers = stats.get("tiers")
        if isinstance(tiers, Mapping):
            rows = {str(name): counts for name, counts in tiers.items()
                    if isinstance(counts, Mapping) and name != "chain"}  # fmt: skip
            yield from self._families(_TIER_METRICS, "tier", rows)
            chain = tiers.get("chain")
            if isinstance(chain, Mapping):
                yield from self._chain_families(chain)

    def _chain_families(self, chain: Mapping[str, Any]) -> Iterator[Metric]:
        """The write path below memory: background writes queued and dropped, values not storable."""
        for key, kind, help_text in _CHAIN_METRICS:
            value = chain.get(key)
            if _is_number(value):
                family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                yield family_type(f"{self._prefix}_tier_{key}", help_text, value=float(value))

    def _families(
        self, specs: tuple[_Spec, ...], label: str, rows: Mapping[str, Mapping[str, Any]]
    ) -> Iterator[Metric]:
        """One family per spec, with a sample per row (level or tier) that has a number for it."""
        for suffix, key, help_text, kind in specs:
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(f"{self._prefix}_{suffix}", help_text, labels=[label])
            for row_name, row in rows.items():
                value = row.get(key)
                if _is_number(value):
                    family.add_metric([row_name], float(value))
            yield family


def register_metrics(cache: StatsSource, registry: CollectorRegistry | None = None) -> VisionCacheCollector:
    """Register a collector for ``cache`` (in the default registry unless one is given)."""
    collector = VisionCacheCollector(cache)
    (REGISTRY if registry is None else registry).register(collector)
    return collector


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
