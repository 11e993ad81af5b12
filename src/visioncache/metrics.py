"""Prometheus metrics for a cache: a collector that reads ``cache.snapshot()`` at scrape time.

The cache's own counters are the single source of truth: nothing is incremented twice, and a
scrape shows exactly what ``snapshot()`` shows. Metrics read typed fields, so a renamed counter
is a type error (mypy), never a silently missing metric. Exposed, per level (pixel, pixel_only,
encoding, embedding): hits, misses, evictions, rejections, single-flight waits, values computed,
seconds of work saved (counters) and entries, bytes (gauges); per shared tier: hits, misses,
errors, corrupt and unverified entries, writes, promotions, breaker skips (counters), whether its
breaker is open, entries and bytes where the tier knows them (gauges); and the write path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from typing_extensions import override

from visioncache.extras import requires
from visioncache.stats import CacheStats
from visioncache.store import StoreStats
from visioncache.tiers import ChainStats, TierStats

with requires("metrics", "visioncache.metrics (Prometheus)"):
    from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["VisionCacheCollector", "register_metrics"]

_Row = TypeVar("_Row")
# (metric name suffix, help, "counter" or "gauge", how to read it from a row; None: no sample)
_Spec = tuple[str, str, str, Callable[[_Row], float | None]]

_LEVEL_METRICS: tuple[_Spec[StoreStats], ...] = (
    ("cache_hits", "Lookups answered from the cache", "counter", lambda s: s.hits),
    ("cache_misses", "Lookups the cache could not answer", "counter", lambda s: s.misses),
    ("cache_evictions", "Entries evicted to make room", "counter", lambda s: s.evictions),
    ("cache_rejections", "Values too large to store", "counter", lambda s: s.rejections),
    (
        "cache_singleflight_waits",
        "Lookups that waited for another thread's computation",
        "counter",
        lambda s: s.singleflight_waits,
    ),
    ("cache_computed", "Values computed on a miss", "counter", lambda s: s.computed),
    ("time_saved_seconds", "Seconds of recorded work hits avoided", "counter", lambda s: s.time_saved),
    ("cache_entries", "Entries held", "gauge", lambda s: s.entries),
    ("cache_bytes", "Bytes held (sum of array nbytes)", "gauge", lambda s: s.bytes),
    ("cache_device_bytes", "Of the bytes held, those on an accelerator", "gauge", lambda s: s.device_bytes),
    ("cache_spills", "Device entries copied to the host", "counter", lambda s: s.spills),
    ("cache_restores", "Spilled entries placed back on device", "counter", lambda s: s.restores),
)
_TIER_METRICS: tuple[_Spec[TierStats], ...] = (
    ("tier_hits", "Shared-tier lookups answered", "counter", lambda t: t.hits),
    ("tier_misses", "Shared-tier lookups not answered", "counter", lambda t: t.misses),
    ("tier_errors", "Shared-tier calls that failed (skipped, not raised)", "counter", lambda t: t.errors),
    ("tier_corrupt", "Corrupt shared-tier entries deleted", "counter", lambda t: t.corrupt),
    ("tier_unverified", "Entries signed with a secret not accepted here", "counter", lambda t: t.unverified),
    ("tier_writes", "Blobs written to a shared tier", "counter", lambda t: t.writes),
    ("tier_promotions", "Blobs copied up from a lower tier", "counter", lambda t: t.promotions),
    ("tier_skipped", "Calls skipped while the tier's breaker was open", "counter", lambda t: t.skipped),
    ("tier_breaker_open", "1 while the tier's circuit breaker is open", "gauge", lambda t: t.breaker_open),
    ("tier_entries", "Entries a shared tier holds", "gauge", lambda t: t.entries),
    ("tier_bytes", "Bytes a shared tier holds", "gauge", lambda t: t.bytes),
)
_CHAIN_METRICS: tuple[_Spec[ChainStats], ...] = (
    ("tier_writes_pending", "Background tier writes queued", "gauge", lambda c: c.writes_pending),
    (
        "tier_writes_pending_bytes",
        "Bytes of background tier writes queued",
        "gauge",
        lambda c: c.writes_pending_bytes,
    ),
    (
        "tier_writes_dropped",
        "Background tier writes dropped: the byte budget was full",
        "counter",
        lambda c: c.writes_dropped,
    ),
    (
        "tier_unserializable",
        "Values not written to shared tiers: they cannot be serialised",
        "counter",
        lambda c: c.unserializable,
    ),
)


class StatsSource(Protocol):
    def snapshot(self) -> CacheStats: ...


class VisionCacheCollector(Collector):
    """Turns one ``snapshot()`` into metric families at every scrape."""

    def __init__(self, cache: StatsSource, *, prefix: str = "visioncache") -> None:
        self._cache = cache
        self._prefix = prefix

    def describe(self) -> list[Metric]:
        # Returning nothing tells the registry not to call `collect` at registration time, which
        # would read the cache's stats before the caller has finished setting it up.
        return []

    @override
    def collect(self) -> Iterator[Metric]:
        stats = self._cache.snapshot()
        yield from self._families(_LEVEL_METRICS, "level", dict(stats.levels))
        if stats.tiers is not None:
            yield from self._families(_TIER_METRICS, "tier", {row.name: row for row in stats.tiers.tiers})
            yield from self._families(_CHAIN_METRICS, None, {"": stats.tiers})

    def _families(
        self, specs: tuple[_Spec[_Row], ...], label: str | None, rows: dict[str, _Row]
    ) -> Iterator[Metric]:
        """One family per spec, with a sample per row (level or tier) that has a number for it."""
        for suffix, help_text, kind, read in specs:
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(f"{self._prefix}_{suffix}", help_text, labels=[label] if label else [])
            for row_name, row in rows.items():
                value = read(row)
                if value is not None:
                    family.add_metric([row_name] if label else [], float(value))
            yield family


def register_metrics(cache: StatsSource, registry: CollectorRegistry | None = None) -> VisionCacheCollector:
    """Register a collector for ``cache`` (in the default registry unless one is given)."""
    collector = VisionCacheCollector(cache)
    (REGISTRY if registry is None else registry).register(collector)
    return collector
