"""`VisionCacheStats`: the reference module's counters, kept name for name (seed_api.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["VisionCacheStats", "hit_rate"]


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
