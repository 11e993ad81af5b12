"""Prometheus: the engine's visioncache on vllm-mlx's own ``/metrics`` endpoint.

With ``--enable-metrics``, vllm-mlx renders one registry at ``/metrics``. Each engine's cache is
added there through visioncache's collector (hits, misses, bytes, tiers, ... per level) and its
`EngineStats` through `EngineCollector` (``visioncache_vllm_mlx_*_total``: tower calls, images
encoded, KV tokens reused, ...), and the installation's `HandleStats` the same way
(``visioncache_vllm_mlx_handles_issued_total``, ...). All read their counters at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

from visioncache.integrations.handles import HandleStats
from visioncache.integrations.vllm_mlx.compat import checked_module
from visioncache.integrations.vllm_mlx.stats import EngineStats

__all__ = ["EngineCollector", "register_collector", "register_engine_metrics", "register_handle_metrics"]

_HELP = {
    "image_requests": "Image requests served through visioncache",
    "image_request_errors": "Image requests that failed (bad image, placeholder mismatch, ...)",
    "scheduler_steps": "Scheduler steps that prepared image requests",
    "vision_tower_calls": "Vision-tower calls (one per step with missing images)",
    "images_encoded": "Images that went through the vision tower",
    "kv_prefix_hits": "Image requests that reused cached KV",
    "kv_prefix_misses": "Image requests that found no cached KV",
    "kv_prefix_refused": "Image requests whose cached KV was not used (its tail cannot be prefilled exactly)",
    "kv_tokens_reused": "Prompt tokens whose KV was reused instead of computed",
    "kv_covered_images_not_encoded": "Images a reused KV prefix held: neither looked up nor encoded",
    "kv_covered_images_encoded_late": "Of those, encoded after all (the engine reused less than probed)",
}
_HANDLE_HELP = {
    "handles_issued": "Images uploaded for a handle",
    "handles_resolved": "Image handles in requests that were served",
    "handles_missing": "Image handles answered 410 (neither features nor bytes held any more)",
    "handles_refused": "Image handles refused as malformed (400) or unknown (404)",
    "handle_images_from_kept_bytes": "Evicted features of handles encoded again from the kept bytes",
    "handle_bytes_corrupt": "Kept image bytes read back whose digest was not the handle's",
}


class EngineCollector:
    """`EngineStats` (or another counters dataclass, with ``help``) as Prometheus counters, read
    at every scrape."""

    def __init__(
        self,
        stats: EngineStats | HandleStats,
        prefix: str = "visioncache_vllm_mlx",
        help: Mapping[str, str] = _HELP,
    ) -> None:
        self._stats = stats
        self._prefix = prefix
        self._help = help

    def describe(self) -> list[Any]:
        return []  # nothing to read at registration time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        for field in fields(self._stats):
            yield CounterMetricFamily(
                f"{self._prefix}_{field.name}", self._help[field.name], value=getattr(self._stats, field.name)
            )


def _registry() -> Any | None:
    """vllm-mlx's ``/metrics`` registry, when that endpoint is enabled (``--enable-metrics``)."""
    metrics = checked_module("vllm_mlx.metrics").metrics  # the collector behind vllm-mlx's /metrics

    prometheus = getattr(metrics, "_prom", None)  # set once metrics are enabled (vllm-mlx 0.6.0)
    return prometheus["registry"] if metrics.enabled and prometheus else None


def register_engine_metrics(cache: Any, stats: EngineStats) -> bool:
    """Add the cache's and the engine's collectors to vllm-mlx's ``/metrics`` registry, when that
    endpoint is enabled; returns whether they were added."""
    registry = _registry()
    if registry is None:
        return False
    from visioncache.metrics import register_metrics

    register_metrics(cache, registry)
    registry.register(EngineCollector(stats))
    return True


def register_handle_metrics(stats: HandleStats) -> bool:
    """Add the handles' counters to vllm-mlx's ``/metrics`` registry, when it is enabled."""
    registry = _registry()
    if registry is not None:
        registry.register(EngineCollector(stats, help=_HANDLE_HELP))
    return registry is not None


def register_collector(collector: Any) -> bool:
    """Add another collector (e.g. `kv_tiers.KVTierCollector`) to vllm-mlx's ``/metrics``
    registry, when it is enabled; returns whether it was added."""
    registry = _registry()
    if registry is not None:
        registry.register(collector)
    return registry is not None
