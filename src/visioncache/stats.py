"""`VisionCacheStats`: the reference module's counters, kept name for name (seed_api.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["VisionCacheStats", "flatten_level_stats", "hit_rate"]

LevelSnapshot = Mapping[str, float]


def hit_rate(hits: float, misses: float) -> float:
    """hits / (hits + misses), 0.0 when there were no lookups."""
    total = hits + misses
    return hits / total if total else 0.0


@dataclass
class VisionCacheStats:
    """Counters of the reference's pixel and encoding levels, plus time saved.

    ``VisionEmbeddingCache.stats`` returns a consistent snapshot taken from the levels' stores;
    per-level detail (pixel-only and embedding levels, bytes, evictions) is in ``get_stats()``.
    """

    pixel_cache_hits: int = 0
    pixel_cache_misses: int = 0
    encoding_cache_hits: int = 0
    encoding_cache_misses: int = 0
    total_time_saved: float = 0.0
    total_images_processed: int = 0

    @classmethod
    def from_levels(cls, levels: Mapping[str, LevelSnapshot], images_processed: int) -> VisionCacheStats:
        """The reference's counters from snapshots of every level's `Store.stats()`."""
        pixel, encoding = levels["pixel"], levels["encoding"]
        return cls(
            pixel_cache_hits=int(pixel["hits"]),
            pixel_cache_misses=int(pixel["misses"]),
            encoding_cache_hits=int(encoding["hits"]),
            encoding_cache_misses=int(encoding["misses"]),
            total_time_saved=sum(level["time_saved"] for level in levels.values()),
            total_images_processed=images_processed,
        )

    @property
    def pixel_hit_rate(self) -> float:
        return hit_rate(self.pixel_cache_hits, self.pixel_cache_misses)

    @property
    def encoding_hit_rate(self) -> float:
        return hit_rate(self.encoding_cache_hits, self.encoding_cache_misses)

    def to_dict(self) -> dict[str, int | float]:
        """The six counters plus the two hit rates."""
        return {
            **asdict(self),
            "pixel_hit_rate": self.pixel_hit_rate,
            "encoding_hit_rate": self.encoding_hit_rate,
        }


def flatten_level_stats(levels: Mapping[str, LevelSnapshot]) -> dict[str, Any]:
    """``{level}_cache_{counter}``, ``{level}_hit_rate`` and ``{level}_time_saved`` for each level."""
    result: dict[str, Any] = {}
    for level, counters in levels.items():
        for name, value in counters.items():
            if name != "time_saved":
                result[f"{level}_cache_{name}"] = value
        result[f"{level}_hit_rate"] = hit_rate(counters["hits"], counters["misses"])
        result[f"{level}_time_saved"] = counters["time_saved"]
    return result
