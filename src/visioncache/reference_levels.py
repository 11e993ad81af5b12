"""The reference module's six level methods (docs/reference-api.md), as a component of the cache.

`ReferenceLevels` is given the cache's levels, its `ImageKeys` and its ``enabled`` switch, and
keeps the reference's prompt-keyed pixel level, its image-list-keyed pixel-only level and its
encoding level with their signatures and defaults, minus the reference's defects: ordered keys,
content identity, copies of ``extra_kwargs`` on store and on hit (defect 7 in
docs/reference-api.md), images counted once per stored key (defect 9). Inputs are validated (the
key is computed) before ``enabled`` is read, so a disabled cache refuses exactly what an enabled
one refuses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from visioncache import forking
from visioncache.entries import EncodingCacheEntry, PixelCacheEntry, PixelOnlyCacheEntry
from visioncache.identity.keys import ImageKeys
from visioncache.level import Level
from visioncache.store.store import PutResult
from visioncache.trees import copy_containers

__all__ = ["ReferenceLevels", "forward_to"]

P = ParamSpec("P")
R = TypeVar("R")


class ReferenceLevels:
    """get/set of the ``pixel``, ``pixel_only`` and ``encoding`` levels."""

    def __init__(self, levels: Mapping[str, Level], keys: ImageKeys, enabled: Callable[[], bool]) -> None:
        self._levels = levels
        self._keys = keys
        self._enabled = enabled
        self._lock = forking.lock()
        self.images_processed = 0  # the reference's total_images_processed

    def _key(self, level: str, images: Sequence[Any], prompt: str | None = None) -> str | None:
        key = self._keys.key(level, images, prompt)  # validates, even when disabled
        return key if len(images) and self._enabled() else None

    def get_pixel_cache(self, images: Sequence[Any], prompt: str) -> PixelCacheEntry | None:
        key = self._key("pixel", images, prompt)
        entry: PixelCacheEntry | None = self._levels["pixel"].get(key) if key else None
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
        key = self._key("pixel", images, prompt)
        if key is None:
            return
        kwargs = copy_containers(dict(extra_kwargs or {}))
        entry = PixelCacheEntry(
            pixel_values, input_ids, attention_mask, image_grid_thw, kwargs, processing_time
        )
        if self._levels["pixel"].put(key, entry, processing_time) is PutResult.INSERTED:
            with self._lock:
                self.images_processed += len(images)

    def get_pixel_values(self, images: Sequence[Any]) -> PixelOnlyCacheEntry | None:
        key = self._key("pixel_only", images)
        value: PixelOnlyCacheEntry | None = self._levels["pixel_only"].get(key) if key else None
        return value

    def set_pixel_values(
        self,
        images: Sequence[Any],
        pixel_values: Any,
        image_grid_thw: Any | None = None,
        processing_time: float = 0.0,
    ) -> None:
        key = self._key("pixel_only", images)
        if key is not None:
            entry = PixelOnlyCacheEntry(pixel_values, image_grid_thw, processing_time)
            self._levels["pixel_only"].put(key, entry, processing_time)

    def get_encoding_cache(self, images: Sequence[Any], prompt: str) -> EncodingCacheEntry | None:
        key = self._key("encoding", images, prompt)
        value: EncodingCacheEntry | None = self._levels["encoding"].get(key) if key else None
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
        key = self._key("encoding", images, prompt)
        if key is not None:
            entry = EncodingCacheEntry(logits, first_token, logprobs, encoding_time)
            self._levels["encoding"].put(key, entry, encoding_time)

    def clear(self) -> None:
        with self._lock:
            self.images_processed = 0


class _HasReference(Protocol):
    _reference: ReferenceLevels


def forward_to(method: Callable[Concatenate[ReferenceLevels, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A facade method that calls ``method`` on the facade's ``_reference`` (signature and
    docstring kept, so the facade stays typed and documented without restating them)."""

    @functools.wraps(method)
    def forward(facade: _HasReference, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(facade._reference, *args, **kwargs)

    return forward
