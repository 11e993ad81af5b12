"""Typed statistics: `CacheStats` (every level and tier) and the reference's `VisionCacheStats`.

Stats are dataclasses everywhere inside visioncache (a renamed counter is a type error, not a
silently missing metric). ``VisionEmbeddingCache.get_stats()`` flattens them into the reference's
dict only at that compatibility edge. Seconds of work that hits avoided are called ``time_saved``
everywhere (per level, and ``total_time_saved`` for the reference's total).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from visioncache.store.store import StoreStats
from visioncache.tiers.stats import ChainStats

__all__ = ["LEVELS", "CacheStats", "VisionCacheStats", "hit_rate"]

LEVELS = ("pixel", "pixel_only", "encoding", "embedding")


def hit_rate(hits: float, misses: float) -> float:
    """hits / (hits + misses), 0.0 when there were no lookups."""
    total = hits + misses
    return hits / total if total else 0.0


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a whole cache: each level's store, the shared tiers, and the reference's
    count of images stored through its prompt-keyed level."""

    levels: Mapping[str, StoreStats]
    tiers: ChainStats | None = None
    images_processed: int = 0

    @property
    def time_saved(self) -> float:
        """Seconds of preprocessing and encoding that hits avoided, all levels."""
        return sum(level.time_saved for level in self.levels.values())

    def to_dict(self) -> dict[str, Any]:
        """The reference's ``get_stats()`` dict, plus ``{level}_cache_{counter}``,
        ``{level}_hit_rate`` and ``{level}_time_saved`` for every level, and ``tiers``."""
        result: dict[str, Any] = VisionCacheStats.from_cache_stats(self).to_dict()
        for level, counters in self.levels.items():
            for field in fields(counters):
                if field.name != "time_saved":
                    result[f"{level}_cache_{_legacy_name(field.name)}"] = getattr(counters, field.name)
            result[f"{level}_hit_rate"] = hit_rate(counters.hits, counters.misses)
            result[f"{level}_time_saved"] = counters.time_saved
        if self.tiers is not None:
            result["tiers"] = self.tiers.to_dict()
        return result


def _legacy_name(name: str) -> str:
    return "size" if name == "entries" else name  # the reference's ``pixel_cache_size``


@dataclass
class VisionCacheStats:
    """Counters of the reference's pixel and encoding levels, plus time saved (docs/reference-api.md).

    ``VisionEmbeddingCache.stats`` returns a consistent snapshot taken from the levels' stores;
    the rest is in ``VisionEmbeddingCache.snapshot()``.
    """

    pixel_cache_hits: int = 0
    pixel_cache_misses: int = 0
    encoding_cache_hits: int = 0
    encoding_cache_misses: int = 0
    total_time_saved: float = 0.0
    total_images_processed: int = 0

    @classmethod
    def from_cache_stats(cls, stats: CacheStats) -> VisionCacheStats:
        """The reference's counters from a `CacheStats` snapshot."""
        pixel, encoding = stats.levels["pixel"], stats.levels["encoding"]
        return cls(
            pixel_cache_hits=pixel.hits,
            pixel_cache_misses=pixel.misses,
            encoding_cache_hits=encoding.hits,
            encoding_cache_misses=encoding.misses,
            total_time_saved=stats.time_saved,
            total_images_processed=stats.images_processed,
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
