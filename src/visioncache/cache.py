"""`VisionEmbeddingCache`: the reference module's API without its defects, plus per-image levels.

Four levels, each a `Store`:

========== ============================== =========================================
level      key                            value
========== ============================== =========================================
pixel      images (ordered) + prompt      `PixelCacheEntry` (the reference's level)
pixel_only images (ordered)               `PixelOnlyCacheEntry`; per image via
                                          `preprocess_images`
encoding   images (ordered) + prompt      `EncodingCacheEntry`
embedding  one image                      the vision encoder's output for that image
========== ============================== =========================================

Every key carries the namespace and salt. Every method validates all of its inputs (types,
files, base64, sizes) before it reads or changes any level, so bad input leaves the cache as it
was. Thread-safe: levels lock themselves; counters are exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from visioncache.batching import resolve
from visioncache.entries import PixelOnlyCacheEntry
from visioncache.errors import (
    ConfigurationError,
    EncoderOutputError,
    UnsupportedImageTypeError,
    describe_input,
)
from visioncache.identity import DEFAULT_MAX_IMAGE_BYTES, ImageHasher
from visioncache.keys import DEFAULT_NAMESPACE, KeyBuilder
from visioncache.reference_levels import ReferenceLevels
from visioncache.stats import VisionCacheStats, flatten_level_stats
from visioncache.store import PutResult, Store
from visioncache.tiers.base import Tier
from visioncache.tiers.chain import TierChain
from visioncache.validation import Expectation, batch_validator
from visioncache.values import parse_byte_size

__all__ = ["VisionEmbeddingCache"]

ByteSize = int | str | None

DEFAULT_MAX_PIXEL_BYTES = "1GiB"
DEFAULT_MAX_ENCODING_BYTES = "1GiB"
DEFAULT_MAX_EMBEDDING_ENTRIES = 4096
DEFAULT_MAX_EMBEDDING_BYTES = "2GiB"


class VisionEmbeddingCache(ReferenceLevels):
    """Caches image preprocessing and vision-encoder outputs, keyed by image content.

    Args keep the reference's names and defaults; the keyword-only ones are new:
        namespace: names the model + processor configuration; entries of different namespaces
            never meet, even in a shared tier. Default ``"default"``: set it per model.
        salt: optional tenant secret mixed into every key, so tenants cannot probe each other.
        max_pixel_bytes / max_encoding_bytes / max_embedding_bytes: byte budgets per level
            (``"1GiB"``, ``"1GiB"``, ``"2GiB"`` by default; an int, a string such as ``"512MiB"``,
            or None for no byte bound). The pixel-only level shares the pixel level's bounds.
        max_embedding_entries: entry bound of the embedding level (default 4096).
        max_image_bytes: larger image inputs raise `ImageTooLargeError` (default ``"256MiB"``).
        tiers: shared tiers below memory (read on a miss and promoted, written on every store):
            a `TierChain`, a list of tiers, None (the default) for memory only, or ``"env"`` to
            build them from ``VISIONCACHE_*`` environment variables (see `from_env`).
    """

    def __init__(
        self,
        max_pixel_entries: int = 100,
        max_encoding_entries: int = 50,
        enabled: bool = True,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        salt: str | bytes | None = None,
        max_pixel_bytes: ByteSize = DEFAULT_MAX_PIXEL_BYTES,
        max_encoding_bytes: ByteSize = DEFAULT_MAX_ENCODING_BYTES,
        max_embedding_entries: int | None = DEFAULT_MAX_EMBEDDING_ENTRIES,
        max_embedding_bytes: ByteSize = DEFAULT_MAX_EMBEDDING_BYTES,
        max_image_bytes: int | str = DEFAULT_MAX_IMAGE_BYTES,
        tiers: TierChain | Sequence[Tier] | str | None = None,
    ):
        for name, value in (("max_pixel_entries", max_pixel_entries),
                            ("max_encoding_entries", max_encoding_entries),
                            ("max_embedding_entries", max_embedding_entries)):  # fmt: skip
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigurationError(f"{name} must be an int >= 0 or None, got {value!r}")
        pixel_bytes = parse_byte_size(max_pixel_bytes, name="max_pixel_bytes")
        image_bytes = parse_byte_size(max_image_bytes, name="max_image_bytes")
        self._keys = KeyBuilder(namespace, salt)
        self._hasher = ImageHasher(image_bytes if image_bytes is not None else DEFAULT_MAX_IMAGE_BYTES)
        self._levels: dict[str, Store] = {
            "pixel": Store(max_pixel_entries, pixel_bytes),
            "pixel_only": Store(max_pixel_entries, pixel_bytes),
            "encoding": Store(max_encoding_entries,
                              parse_byte_size(max_encoding_bytes, name="max_encoding_bytes")),
            "embedding": Store(max_embedding_entries,
                               parse_byte_size(max_embedding_bytes, name="max_embedding_bytes")),
        }  # fmt: skip
        self._images_processed = 0
        self._lock = threading.Lock()
        self._tiers = TierChain.from_spec(tiers)
        if self._tiers is not None:
            self._tiers.register_namespace(self._keys.tag, self._keys.namespace)
        self.enabled = enabled

    @classmethod
    def from_env(cls, **kwargs: Any) -> VisionEmbeddingCache:
        """A cache whose tiers come from ``VISIONCACHE_*`` environment variables (see
        `TierChain.from_env`; none set means memory only); other arguments as the constructor's."""
        return cls(tiers="env", **kwargs)

    # ---- configuration -------------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        return self._keys.namespace

    @property
    def max_pixel_entries(self) -> int | None:
        return self._levels["pixel"].max_entries

    @property
    def max_encoding_entries(self) -> int | None:
        return self._levels["encoding"].max_entries

    def level(self, name: str) -> Store:
        """The store of one level: ``pixel``, ``pixel_only``, ``encoding`` or ``embedding``."""
        return self._levels[name]

    # ---- identity ------------------------------------------------------------------------------
    def image_digests(self, images: Sequence[Any]) -> list[bytes]:
        """The content digest of each image, in order; raises a typed error for any bad input."""
        if type(images) not in (list, tuple) and (  # the exact types first: this is the hit path
            isinstance(images, str | bytes | bytearray | memoryview) or not isinstance(images, Sequence)
        ):
            raise UnsupportedImageTypeError(
                f"images must be a list or tuple of image inputs, got {describe_input(images)}"
            )
        digest = self._hasher.digest
        return [digest(image) for image in images]

    def _key(self, level: str, images: Sequence[Any], prompt: str | None = None) -> str | None:
        digests = self.image_digests(images)
        return self._keys.key(level, digests, prompt) if digests else None

    def _image_keys(self, level: str, images: Sequence[Any]) -> list[str]:
        return [self._keys.image_key(level, digest) for digest in self.image_digests(images)]

    @property
    def tiers(self) -> TierChain | None:
        """The shared tiers below memory, or None."""
        return self._tiers

    def _get(self, level: str, key: str) -> Any | None:
        """Memory, then the lower tiers (a hit there is promoted into memory)."""
        store = self._levels[level]
        value = store.get(key)
        if value is None and self._tiers is not None and store.enabled:
            loaded = self._tiers.load_entry(key)
            if loaded is not None:
                value, cost = loaded
                store.put(key, value, cost=cost)
                # store.get counted a miss; from the caller's side this was a hit.
                store.record(hits=1, misses=-1, time_saved=cost)
        return value

    def _put(self, level: str, key: str, value: Any, cost: float) -> PutResult:
        """Memory, and down to every lower tier."""
        result = self._levels[level].put(key, value, cost=cost)
        if self._tiers is not None and result is not PutResult.DISABLED:
            self._tiers.save_entry(key, value, cost)
        return result

    # ---- per-image levels ----------------------------------------------------------------------
    def get_image_embeddings(self, images: Sequence[Any]) -> list[Any | None]:
        """The cached encoder output of each image, or None where missing; in input order."""
        if not self.enabled:
            return [None] * len(images)
        return [self._get("embedding", key) for key in self._image_keys("embedding", images)]

    def set_image_embeddings(
        self, images: Sequence[Any], values: Sequence[Any], encoding_time: float = 0.0
    ) -> None:
        """Store one encoder output per image; ``encoding_time`` is what encoding them all cost."""
        keys = self._image_keys("embedding", images)
        if len(values) != len(keys):
            raise EncoderOutputError(f"got {len(values)} values for {len(keys)} images")
        if not self.enabled or not keys:
            return
        for key, value in zip(keys, values, strict=True):
            self._put("embedding", key, value, encoding_time / len(keys))

    def encode_images(
        self,
        images: Sequence[Any],
        encode_fn: Callable[[list[Any]], Sequence[Any]],
        *,
        expect: Expectation = None,
    ) -> list[Any]:
        """Encoder output per image, in input order; only the missing images are encoded.

        The misses, deduplicated and in first-seen order, go to ONE call of
        ``encode_fn(missing_images) -> values``; ``encode_fn`` is not called when all hit. While
        one thread encodes an image, others asking for it wait for that result. See `resolve`.
        """
        return self.encode_batch([images], encode_fn, expect=None if expect is None else [expect])[0]

    def encode_batch(
        self,
        requests: Sequence[Sequence[Any]],
        encode_fn: Callable[[list[Any]], Sequence[Any]],
        *,
        expect: Sequence[Expectation] | Callable[[Any], bool] | None = None,
    ) -> list[list[Any]]:
        """`encode_images` for a scheduler step: all misses of all requests in one encode call.

        ``expect`` is a callable for every value, or one `Expectation` per request.
        """
        flat = [image for request in requests for image in request]
        if not self.enabled:
            values = list(encode_fn(flat)) if flat else []
            if len(values) != len(flat):
                raise EncoderOutputError(f"encode_fn returned {len(values)} values for {len(flat)} images")
        else:
            keys = self._image_keys("embedding", flat)
            validator = batch_validator(expect, [len(request) for request in requests])
            values = resolve(self._levels["embedding"], keys, flat, encode_fn, validate=validator,
                             lower=self._tiers)  # fmt: skip
        results, start = [], 0
        for request in requests:
            results.append(values[start : start + len(request)])
            start += len(request)
        return results

    def preprocess_images(
        self,
        images: Sequence[Any],
        preprocess_fn: Callable[[list[Any]], Sequence[PixelOnlyCacheEntry]],
    ) -> list[PixelOnlyCacheEntry]:
        """Per-image image-processor output; only the missing images are preprocessed, in one call.

        Entries live in the pixel-only level under the key of a one-image list, so
        ``get_pixel_values([image])`` finds them too.
        """
        if not self.enabled:
            return list(preprocess_fn(list(images)))
        keys = self._image_keys("pixel_only", images)
        return resolve(self._levels["pixel_only"], keys, list(images), preprocess_fn, what="preprocess_fn",
                       lower=self._tiers)  # fmt: skip

    @contextmanager
    def pinned(self, images: Sequence[Any]) -> Iterator[None]:
        """Keep these images' embedding and pixel-only entries from eviction inside the block.

        Pins may be taken before the entries exist (a request pins its images at admission, then
        encodes them). Pinned entries are never evicted; when they alone fill a level's budget,
        new values for that level are returned to their callers but not stored (rejections).
        """
        digests = self.image_digests(images)
        pins = [(self._levels[level], self._keys.image_key(level, digest))
                for digest in digests for level in ("embedding", "pixel_only")]  # fmt: skip
        for store, key in pins:
            store.pin(key)
        try:
            yield
        finally:
            for store, key in pins:
                store.unpin(key)

    # ---- stats ---------------------------------------------------------------------------------
    @property
    def stats(self) -> VisionCacheStats:
        """A snapshot of the reference's counters (hits/misses of the pixel and encoding levels)."""
        snapshots = {level: store.stats() for level, store in self._levels.items()}
        return VisionCacheStats.from_levels(snapshots, self._images_processed)

    def get_stats(self) -> dict[str, Any]:
        """The reference's stats and sizes, plus per level: hits, misses, hit rate, size, bytes,
        evictions, rejections, single-flight waits, validation failures, images computed."""
        snapshots = {level: store.stats() for level, store in self._levels.items()}
        result: dict[str, Any] = VisionCacheStats.from_levels(snapshots, self._images_processed).to_dict()
        result.update(flatten_level_stats(snapshots))
        result["embedding_images_encoded"] = result["embedding_cache_computed"]
        if self._tiers is not None:
            result["tiers"] = self._tiers.stats()
        return result

    def clear(self) -> None:
        """Empty every level and reset the stats (pins held by running requests stay)."""
        for store in self._levels.values():
            store.clear()
        with self._lock:
            self._images_processed = 0
        self._hasher.path_memo.clear()

    def __repr__(self) -> str:
        sizes = " ".join(f"{name}={len(self._levels[name])}/{self._levels[name].max_entries}"
                         for name in ("pixel", "pixel_only", "encoding"))  # fmt: skip
        return f"<VisionEmbeddingCache {sizes}>"
