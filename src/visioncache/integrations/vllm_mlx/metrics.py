"""Prometheus: the engine's visioncache on vllm-mlx's own ``/metrics`` endpoint.

With ``--enable-metrics``, vllm-mlx renders one registry at ``/metrics``. Each engine's cache is
added there through visioncache's collector (hits, misses, bytes, tiers, ... per level) and its
`EngineStats` through `EngineCollector` (``visioncache_vllm_mlx_*_total``: tower calls, images
encoded, KV tokens reused, ...). Both read their counters at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from visioncache.integrations.vllm_mlx.stats import EngineStats

__all__ = ["EngineCollector", "register_engine_metrics"]

_HELP = {
    "image_requests": "Image requests served through visioncache",
    "image_request_errors": "Image requests that failed (bad image, placeholder mismatch, ...)",
    "scheduler_steps": "Scheduler steps that prepared image requests",
    "vision_tower_calls": "Vision-tower calls (one per step with missing images)",
    "images_encoded": "Images that went through the vision tower",
    "kv_prefix_hits": "Image requests that reused cached KV",
    "kv_prefix_misses": "Image requests that found no cached KV",
    "kv_tokens_reused": "Prompt tokens whose KV was reused instead of computed",
}


class EngineCollector:
    """`EngineStats` as Prometheus counters, read at every scrape."""

    def __init__(self, stats: EngineStats, prefix: str = "visioncache_vllm_mlx") -> None:
        self._stats = stats
        self._prefix = prefix

    def describe(self) -> list[Any]:
        return []  # nothing to read at registration time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        for field in fields(EngineStats):
            yield CounterMetricFamily(
                f"{self._prefix}_{field.name}", _HELP[field.name], value=getattr(self._stats, field.name)
            )


def register_engine_metrics(cache: Any, stats: EngineStats) -> bool:
    """Add the cache's and the engine's collectors to vllm-mlx's ``/metrics`` registry, when that
    endpoint is enabled (``--enable-metrics``); returns whether they were added."""
    from vllm_mlx.metrics import metrics  # the collector behind vllm-mlx's /metrics endpoint

    prometheus = getattr(metrics, "_prom", None)  # set once metrics are enabled (vllm-mlx 0.6.0)
    if not metrics.enabled or not prometheus:
        return False
    from visioncache.metrics import register_metrics

    registry = prometheus["registry"]
    register_metrics(cache, registry)
    registry.register(EngineCollector(stats))
    return True
