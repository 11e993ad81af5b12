"""The connector's counters, reported through vLLM's EC-connector stats hooks.

Each engine step the worker half returns what it saved (`WorkerCounts`, through
``build_connector_worker_meta``); the scheduler half adds what it loaded and the tiers' error
counts, and hands vLLM one `VisionCacheECStats` per logging interval (``get_ec_connector_stats``).
vLLM logs it and feeds `VisionCachePromMetrics`, which exports ``vllm:visioncache_ec_*`` counters
per engine on the server's ``/metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from typing_extensions import override
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorWorkerMetadata
from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorPromMetrics, ECConnectorStats

__all__ = ["COUNTERS", "VisionCacheECStats", "VisionCachePromMetrics", "WorkerCounts"]

# (name, help): every counter is summed over workers and intervals.
COUNTERS: tuple[tuple[str, str], ...] = (
    ("lookups", "Items the scheduler asked the shared tiers for"),
    ("hits", "Items found intact in a shared tier and loaded instead of encoded"),
    ("misses", "Items not found (or found unusable) in the shared tiers"),
    ("loaded_bytes", "Bytes of encoder outputs loaded from the shared tiers"),
    ("load_seconds", "Seconds spent loading and verifying encoder outputs"),
    ("seconds_saved", "Seconds of encoder work the loaded outputs had cost"),
    ("saves", "Encoder outputs handed to the background writer"),
    ("saved_bytes", "Bytes of encoder outputs handed to the background writer"),
    ("saves_dropped", "Encoder outputs not queued: the writer's byte budget was full"),
    ("encoded_items", "Items the worker encoded (and offered to the tiers)"),
    ("encode_seconds", "Seconds of encoder work for those items (step time, shared per item)"),
    ("tier_errors", "Shared-tier calls that failed; each failure opens that tier's breaker"),
    ("tier_corrupt", "Corrupt entries found and deleted"),
    ("tier_unverified", "Entries signed under a secret this server does not accept"),
    ("tier_skipped", "Shared-tier calls skipped while a breaker was open"),
    ("weight_epochs", "Weight updates observed: each moved the keys to a new namespace"),
    ("late_digests", "Items the scheduler hashed on its own thread (not hashed as their request arrived)"),
)
_NAMES = tuple(name for name, _ in COUNTERS)


@dataclass
class WorkerCounts(ECConnectorWorkerMetadata):  # type: ignore[misc]  # vLLM is untyped for mypy
    """What a worker's saves did in one step (summed over workers by `aggregate`)."""

    saves: int = 0
    saved_bytes: int = 0
    saves_dropped: int = 0
    encoded_items: int = 0
    encode_seconds: float = 0.0
    tier_errors: int = 0  # the worker's own tier counts since its last report (its writes)
    tier_corrupt: int = 0
    tier_unverified: int = 0
    tier_skipped: int = 0

    @override
    def aggregate(self, other: ECConnectorWorkerMetadata) -> ECConnectorWorkerMetadata:
        if not isinstance(other, WorkerCounts):
            return self
        return WorkerCounts(
            **{item.name: getattr(self, item.name) + getattr(other, item.name) for item in fields(self)}
        )

    def as_dict(self) -> dict[str, float]:
        return {item.name: float(getattr(self, item.name)) for item in fields(self)}


@dataclass
class VisionCacheECStats(ECConnectorStats):  # type: ignore[misc]  # vLLM is untyped for mypy
    """One interval's counters (`COUNTERS`), as vLLM's stats hooks expect."""

    data: dict[str, Any] = field(default_factory=dict)

    @override
    def reset(self) -> None:
        self.data = {}

    @override
    def aggregate(self, other: ECConnectorStats) -> ECConnectorStats:
        for name in _NAMES:
            self.data[name] = self.data.get(name, 0) + other.data.get(name, 0)
        return self

    @override
    def reduce(self) -> dict[str, int | float]:
        reduced: dict[str, int | float] = {name: self.data.get(name, 0) for name in _NAMES}
        hits = reduced["hits"]
        reduced["ms_per_load"] = round(1e3 * reduced["load_seconds"] / hits, 3) if hits else 0.0
        encoded = reduced["encoded_items"]
        reduced["ms_per_encode"] = round(1e3 * reduced["encode_seconds"] / encoded, 3) if encoded else 0.0
        return reduced

    @override
    def is_empty(self) -> bool:
        return not any(self.data.get(name) for name in _NAMES)


class VisionCachePromMetrics(ECConnectorPromMetrics):  # type: ignore[misc]  # vLLM is untyped for mypy
    """``vllm:visioncache_ec_<counter>`` counters, one child per engine."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[str, dict[int, Any]] = {}
        for name, help_text in COUNTERS:
            counter = self._counter_cls(
                name=f"vllm:visioncache_ec_{name}", documentation=help_text, labelnames=labelnames
            )
            self._counters[name] = {
                engine: counter.labels(*values) for engine, values in per_engine_labelvalues.items()
            }

    @override
    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, children in self._counters.items():
            value = transfer_stats_data.get(name, 0)
            if value and engine_idx in children:
                children[engine_idx].inc(value)
