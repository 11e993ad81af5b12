"""The reference module's six level methods (seed_api.md), on the cache's primitives.

`VisionEmbeddingCache` provides the primitives (``_key``, ``_get``, ``_put``, ``enabled``); this
mixin keeps the reference's prompt-keyed pixel level, its image-list-keyed pixel-only level and its
encoding level, with their signatures and defaults, minus the reference's defects: ordered keys,
content identity, copies of ``extra_kwargs`` on store and on hit (defect 7), images counted once per
stored key (defect 9).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from visioncache.entries import EncodingCacheEntry, PixelCacheEntry, PixelOnlyCacheEntry
from visioncache.store import PutResult
from visioncache.values import copy_containers

__all__ = ["ReferenceLevels"]


class ReferenceLevels:
    """get/set of the ``pixel``, ``pixel_only`` and ``encoding`` levels."""

    enabled: bool
    _images_processed: int
    _lock: threading.Lock

    def _key(self, level: str, images: Sequence[Any], prompt: str | None = None) -> str | None:
        raise NotImplementedError

    def _get(self, level: str, key: str) -> Any | None:
        raise NotImplementedError

    def _put(self, level: str, key: str, value: Any, cost: float) -> PutResult:
        raise NotImplementedError

    def get_pixel_cache(self, images: Sequence[Any], prompt: str) -> PixelCacheEntry | None:
        """Processor output cached for these images (in this order) and this prompt."""
        key = self._key("pixel", images, prompt) if self.enabled else None
        entry = self._get("pixel", key) if key else None
        # A copy of the containers: a consumer mutating extra_kwargs cannot reach the cache.
        return replace(entry, extra_kwargs=copy_containers(entry.extra_kwargs)) if entry else None

    def set_pixel_cache(
        self,
        images: Sequence[Any],
        prompt: str,
        pixel_values: Any,
        input_ids: Any,
        attention_mask: Any | None = None,
        image_grid_thw: Any | None = None,
        extra_kwargs: dict[str, Any] | None = None,
        processing_time: float = 0.0,
    ) -> None:
        key = self._key("pixel", images, prompt) if self.enabled else None
        if key is None:
            return
        entry = PixelCacheEntry(pixel_values, input_ids, attention_mask, image_grid_thw,
                                copy_containers(dict(extra_kwargs or {})), processing_time)  # fmt: skip
        if self._put("pixel", key, entry, processing_time) is PutResult.INSERTED:
            with self._lock:
                self._images_processed += len(images)

    def get_pixel_values(self, images: Sequence[Any]) -> PixelOnlyCacheEntry | None:
        """Image-processor output cached for these images (prompt-independent)."""
        key = self._key("pixel_only", images) if self.enabled else None
        value: PixelOnlyCacheEntry | None = self._get("pixel_only", key) if key else None
        return value

    def set_pixel_values(
        self,
        images: Sequence[Any],
        pixel_values: Any,
        image_grid_thw: Any | None = None,
        processing_time: float = 0.0,
    ) -> None:
        key = self._key("pixel_only", images) if self.enabled else None
        if key is not None:
            entry = PixelOnlyCacheEntry(pixel_values, image_grid_thw, processing_time)
            self._put("pixel_only", key, entry, processing_time)

    def get_encoding_cache(self, images: Sequence[Any], prompt: str) -> EncodingCacheEntry | None:
        key = self._key("encoding", images, prompt) if self.enabled else None
        value: EncodingCacheEntry | None = self._get("encoding", key) if key else None
        return value

    def set_encoding_cache(
        self,
        images: Sequence[Any],
        prompt: str,
        logits: Any,
        first_token: int,
        logprobs: Any,
        encoding_time: float = 0.0,
    ) -> None:
        key = self._key("encoding", images, prompt) if self.enabled else None
        if key is not None:
            entry = EncodingCacheEntry(logits, first_token, logprobs, encoding_time)
            self._put("encoding", key, entry, encoding_time)
