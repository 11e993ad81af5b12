"""`VisionEmbeddingCache`: the reference module's API without its defects, plus per-image levels.

A facade over four `Level`\\ s, each a memory `Store` plus the shared tiers, which the level alone
talks to: ``pixel`` (images in order + prompt -> `PixelCacheEntry`, the reference's level),
``pixel_only`` (images in order -> `PixelOnlyCacheEntry`; per image via `preprocess_images`),
``encoding`` (images + prompt -> `EncodingCacheEntry`) and ``embedding`` (one image -> the vision
encoder's output for it).

Every key carries the namespace and salt. Every method validates all of its inputs (types,
files, base64, sizes) before it reads or changes any level, whether the cache is enabled or not,
so bad input leaves the cache as it was. Thread-safe: levels lock themselves; counters are exact.
Constructing a cache has no side effects: tiers open files, sockets and threads at first use.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from visioncache.entries import PixelOnlyCacheEntry
from visioncache.errors import (
    ConfigurationError,
    InvalidArgumentError,
    UnsupportedImageTypeError,
    UnsupportedInputTypeError,
    describe_input,
)
from visioncache.identity.hasher import DEFAULT_MAX_IMAGE_BYTES, ImageHasher
from visioncache.identity.keys import DEFAULT_NAMESPACE, ImageKeys, KeyBuilder, is_image_sequence
from visioncache.level import Level, as_results
from visioncache.reference_levels import ReferenceLevels, forward_to
from visioncache.stats import CacheStats, VisionCacheStats
from visioncache.store.device import AUTO, parse_device_budget
from visioncache.store.store import Store
from visioncache.tiers.base import Tier
from visioncache.tiers.chain import TierChain
from visioncache.tiers.config import chain_from_spec
from visioncache.tiers.settings import TierSettings
from visioncache.trees import parse_byte_size, tree_nbytes
from visioncache.validation import Expectation, batch_validator

__all__ = ["VisionEmbeddingCache"]

P = ParamSpec("P")
R = TypeVar("R")
ByteSize = int | str | None
Encoder = Callable[[list[Any]], Iterable[Any]]


def _check_entries(name: str, value: object) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigurationError(f"{name} must be an int >= 0 or None, got {value!r}")
    return value


class VisionEmbeddingCache:
    """Caches image preprocessing and vision-encoder outputs, keyed by image content.

    Args keep the reference's names and defaults; the keyword-only ones are new:
        namespace: names the model + processor configuration; entries of different namespaces
            never meet, even in a shared tier. Default ``"default"``: set it per model.
        salt: optional tenant secret mixed into every key (tier keys included), so tenants can
            neither share entries nor probe each other's.
        max_pixel_bytes / max_encoding_bytes / max_embedding_bytes: byte budgets per level
            (``"1GiB"``, ``"1GiB"``, ``"2GiB"``; an int, a string such as ``"512MiB"``, or None for
            no byte bound). The pixel-only level shares the pixel level's bounds.
        max_embedding_entries: entry bound of the embedding level (default 4096).
        max_image_bytes: larger inputs raise `ImageTooLargeError` (default ``"256MiB"``).
        policy: ``"lru"`` (default) or ``"cost"``: evict by recompute-seconds per byte
            (GreedyDual-Size) instead of recency.
        embedding_device: where embeddings read from a tier are placed (e.g. ``"cuda:0"``);
            default: the device of the last locally computed embedding, else the CPU.
        max_embedding_device_bytes: the embedding level's budget on an accelerator (torch CUDA,
            MPS, XPU), apart from ``max_embedding_bytes``, which then bounds host memory only.
            Embeddings stay on the device they were computed on (a hit returns that tensor, no
            copy); past the budget the least-recently-used ones are spilled to host memory, and
            placed back on the device at their next hit. ``"auto"`` (default): 25% of the
            device's free memory at the first embedding stored there; ``"N%"`` of it; a byte
            size (``0``: keep every embedding on the host); None: no device budget (every byte
            counts against ``max_embedding_bytes`` wherever it lives).
        tiers: shared tiers below memory: None (the default: memory only), a `TierChain`,
            `TierSettings`, a list of tiers, or ``"env"`` to build them from ``VISIONCACHE_*``
            (see `from_env`).
    """

    def __init__(
        self,
        max_pixel_entries: int = 100,
        max_encoding_entries: int = 50,
        enabled: bool = True,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        salt: str | bytes | None = None,
        max_pixel_bytes: ByteSize = "1GiB",
        max_encoding_bytes: ByteSize = "1GiB",
        max_embedding_entries: int | None = 4096,
        max_embedding_bytes: ByteSize = "2GiB",
        max_image_bytes: int | str = DEFAULT_MAX_IMAGE_BYTES,
        policy: str = "lru",
        embedding_device: Any = None,
        max_embedding_device_bytes: int | str | None = AUTO,
        tiers: TierChain | TierSettings | Sequence[Tier] | str | None = None,
    ):
        pixel_entries = _check_entries("max_pixel_entries", max_pixel_entries)
        encoding_entries = _check_entries("max_encoding_entries", max_encoding_entries)
        embedding_entries = _check_entries("max_embedding_entries", max_embedding_entries)
        pixel_bytes = parse_byte_size(max_pixel_bytes, name="max_pixel_bytes")
        image_bytes = parse_byte_size(max_image_bytes, name="max_image_bytes")
        encoding_bytes = parse_byte_size(max_encoding_bytes, name="max_encoding_bytes")
        embedding_bytes = parse_byte_size(max_embedding_bytes, name="max_embedding_bytes")
        parse_device_budget(max_embedding_device_bytes, name="max_embedding_device_bytes")
        builder = KeyBuilder(namespace, salt)
        self._keys = ImageKeys(
            builder, ImageHasher(DEFAULT_MAX_IMAGE_BYTES if image_bytes is None else image_bytes)
        )
        self._tiers = chain = chain_from_spec(tiers)
        if chain is not None:
            chain.register_namespace(builder.tag, namespace)
        self._levels = {
            "pixel": Level("pixel", Store(pixel_entries, pixel_bytes, policy=policy), chain),
            "pixel_only": Level("pixel_only", Store(pixel_entries, pixel_bytes, policy=policy), chain),
            "encoding": Level("encoding", Store(encoding_entries, encoding_bytes, policy=policy), chain),
            "embedding": Level(
                "embedding",
                Store(
                    embedding_entries,
                    embedding_bytes,
                    policy=policy,
                    device_bytes=max_embedding_device_bytes,
                ),
                chain,
                device=embedding_device,
            ),
        }
        self._reference = ReferenceLevels(self._levels, self._keys, lambda: self.enabled)
        self.enabled = enabled

    @classmethod
    def from_env(cls, **kwargs: Any) -> VisionEmbeddingCache:
        """A cache whose tiers come from ``VISIONCACHE_*`` environment variables (see
        `visioncache.tiers.settings.TierSettings.from_env`; none set means memory only)."""
        return cls(tiers="env", **kwargs)

    # ---- configuration and lifecycle -----------------------------------------------------------
    @property
    def namespace(self) -> str:
        return self._keys.builder.namespace

    @property
    def max_pixel_entries(self) -> int | None:
        return self._levels["pixel"].store.max_entries

    @property
    def max_encoding_entries(self) -> int | None:
        return self._levels["encoding"].store.max_entries

    @property
    def tiers(self) -> TierChain | None:
        """The shared tiers below memory, or None."""
        return self._tiers

    def with_salt(self, salt: str | bytes | None) -> VisionEmbeddingCache:
        """A view of this cache for another tenant: the same levels (entries, budgets, pins,
        stats) and tiers, keys under ``salt``. A server of many tenants keeps one bounded cache
        and hands each request its tenant's view; `close` the cache itself, not its views."""
        builder = KeyBuilder(self.namespace, salt)
        view = copy.copy(self)
        view._keys = ImageKeys(builder, self._keys.hasher)
        view._reference = ReferenceLevels(self._levels, view._keys, lambda: view.enabled)
        if self._tiers is not None:
            self._tiers.register_namespace(builder.tag, self.namespace)
        return view

    def close(self) -> None:
        """Flush queued tier writes and close the tiers (the memory levels stay usable)."""
        if self._tiers is not None:
            self._tiers.close()

    def __enter__(self) -> VisionEmbeddingCache:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # ---- identity ------------------------------------------------------------------------------
    def image_digests(self, images: Sequence[Any]) -> list[bytes]:
        """The content digest of each image, in order (what every key of the image is built on).

        Args:
            images: a sequence of images: PIL images, numpy arrays or tensors, file paths,
                bytes, base64 or ``data:`` URLs (docs/inputs.md).

        Returns:
            One 32-byte blake3 digest per image, in input order.

        Raises:
            UnsupportedImageTypeError: ``images`` is not a list/tuple, or holds an unsupported type.
            InvalidImageError: an image cannot be read (a missing file, bad base64, a non-image).
            ImageTooLargeError: an image is larger than ``max_image_bytes``.
        """
        return self._keys.digests(images)

    def key(self, level: str, images: Sequence[Any], prompt: str | None = None) -> str | None:
        """The key of ``images`` (in order) and ``prompt`` in ``level``.

        Args:
            level: ``"pixel"``, ``"pixel_only"``, ``"encoding"`` or ``"embedding"``.
            images: a sequence of images: PIL images, numpy arrays or tensors, file paths,
                bytes, base64 or ``data:`` URLs (docs/inputs.md).
            prompt: the prompt, for the prompt-keyed levels (``pixel``, ``encoding``).

        Returns:
            The key (namespace, salt, level and content digests), or None for no images.

        Raises:
            UnsupportedImageTypeError: ``images`` is not a list/tuple, or holds an unsupported type.
            InvalidImageError: an image cannot be read (a missing file, bad base64, a non-image).
            ImageTooLargeError: an image is larger than ``max_image_bytes``.
            InvalidArgumentError: ``level`` names no level.
        """
        if level not in self._levels:
            raise InvalidArgumentError(f"level must be one of {sorted(self._levels)}, got {level!r}")
        key = self._keys.key(level, images, prompt)
        return key if len(images) else None

    def _make_key(self, images: Sequence[Any], prompt: str) -> str:
        """The reference's private key helper (peers' tests call it): ordered, content-based."""
        return self._keys.key("pixel", images, prompt)

    def _make_image_only_key(self, images: Sequence[Any]) -> str:
        """The reference's private key helper for the pixel-only level."""
        return self._keys.key("pixel_only", images)

    # ---- per-image levels ----------------------------------------------------------------------
    def get_image_embeddings(self, images: Sequence[Any]) -> list[Any | None]:
        """The cached encoder output of each image (memory first, then the tiers).

        Args:
            images: a sequence of images: PIL images, numpy arrays or tensors, file paths,
                bytes, base64 or ``data:`` URLs (docs/inputs.md).

        Returns:
            One value per image, in input order, None where nothing is cached (or disabled).

        Raises:
            UnsupportedImageTypeError: ``images`` is not a list/tuple, or holds an unsupported type.
            InvalidImageError: an image cannot be read (a missing file, bad base64, a non-image).
            ImageTooLargeError: an image is larger than ``max_image_bytes``.
        """
        keys = self._keys.image_keys("embedding", images)
        return self._levels["embedding"].get_many(keys) if self.enabled else [None] * len(keys)

    def set_image_embeddings(
        self, images: Sequence[Any], values: Sequence[Any], encoding_time: float = 0.0
    ) -> None:
        """Store one encoder output per image (in memory, and written behind to the tiers).

        Args:
            images: a sequence of images: PIL images, numpy arrays or tensors, file paths,
                bytes, base64 or ``data:`` URLs (docs/inputs.md).
            values: one encoder output per image (an array, tensor or a tree of them).
            encoding_time: seconds encoding them all cost (the cost policy weighs entries by it).

        Raises:
            UnsupportedImageTypeError: ``images`` is not a list/tuple, or holds an unsupported type.
            InvalidImageError: an image cannot be read (a missing file, bad base64, a non-image).
            ImageTooLargeError: an image is larger than ``max_image_bytes``.
            UnsupportedInputTypeError: ``values`` is not a list/tuple.
            InvalidArgumentError: the counts differ, or a value cannot be sized. Every value is
                checked before any is stored: a bad one stores nothing.
        """
        keys = self._keys.image_keys("embedding", images)
        if not is_image_sequence(values):
            raise UnsupportedInputTypeError(f"values must be a list or tuple, got {describe_input(values)}")
        if len(values) != len(keys):
            raise InvalidArgumentError(f"got {len(values)} values for {len(keys)} images")
        for value in values:
            try:
                tree_nbytes(value)
            except Exception as error:
                raise InvalidArgumentError(f"cannot size {describe_input(value)}: {error!r}") from error
        if self.enabled:
            for key, value in zip(keys, values, strict=True):
                self._levels["embedding"].put(key, value, encoding_time / len(keys))

    def encode_images(
        self, images: Sequence[Any], encode_fn: Encoder, *, expect: Expectation = None
    ) -> list[Any]:
        """Encoder output per image, in input order; only the missing images are encoded.

        The misses, deduplicated and in first-seen order, go to ONE call of
        ``encode_fn(missing_images) -> values``; ``encode_fn`` is not called when all hit. While
        one thread encodes an image, others asking for it wait for that result. See `Level.resolve`.

        Args:
            images: a sequence of images: PIL images, numpy arrays or tensors, file paths,
                bytes, base64 or ``data:`` URLs (docs/inputs.md).
            encode_fn: ``(images) -> values``, one value per image given, in order.
            expect: an `Expectation` (e.g. token counts) a value must meet to be stored and
                returned from the cache; a cached value that fails it is encoded again.

        Returns:
            One value per image, in input order.

        Raises:
            UnsupportedImageTypeError: ``images`` is not a list/tuple, or holds an unsupported type.
            InvalidImageError: an image cannot be read (a missing file, bad base64, a non-image).
            ImageTooLargeError: an image is larger than ``max_image_bytes``.
            EncoderOutputError: ``encode_fn`` returned another number of values than images, or a
                value visioncache cannot store. What ``encode_fn`` raises propagates, and
                nothing is stored for its images.
        """
        return self.encode_batch([images], encode_fn, expect=None if expect is None else [expect])[0]

    def encode_batch(
        self,
        requests: Sequence[Sequence[Any]],
        encode_fn: Encoder,
        *,
        expect: Sequence[Expectation] | Callable[[Any], bool] | None = None,
    ) -> list[list[Any]]:
        """`encode_images` for a scheduler step: all misses of all requests in one encode call.

        Args:
            requests: one image sequence per request (see `encode_images`).
            encode_fn: ``(images) -> values`` for the step's misses, deduplicated across requests.
            expect: a callable for every value, or one `Expectation` per request.

        Returns:
            One list of values per request, each in its request's image order.

        Raises:
            UnsupportedImageTypeError: ``requests`` is not a list of image lists (or see `encode_images`).
            InvalidArgumentError: ``expect`` does not match the requests.
            EncoderOutputError: as for `encode_images`.
        """
        if not is_image_sequence(requests):
            raise UnsupportedImageTypeError(
                f"requests must be a list of image lists, got {describe_input(requests)}"
            )
        keys_per_request = [self._keys.image_keys("embedding", request) for request in requests]
        lengths = [len(keys) for keys in keys_per_request]
        validator = None if expect is None else batch_validator(expect, lengths)
        if len(requests) == 1:  # encode_images: no flattening
            flat, keys = list(requests[0]), keys_per_request[0]
        else:
            flat = [image for request in requests for image in request]
            keys = [key for request_keys in keys_per_request for key in request_keys]
        if not self.enabled:  # everything is computed, in input order, and nothing is stored
            values = as_results(encode_fn(flat), len(flat), "encode_fn") if flat else []
        else:
            values = self._levels["embedding"].resolve(keys, flat, encode_fn, validate=validator)
        if len(requests) == 1:
            return [values]
        results, start = [], 0
        for request_keys in keys_per_request:
            results.append(values[start : start + len(request_keys)])
            start += len(request_keys)
        return results

    def preprocess_images(
        self, images: Sequence[Any], preprocess_fn: Callable[[list[Any]], Iterable[PixelOnlyCacheEntry]]
    ) -> list[PixelOnlyCacheEntry]:
        """Per-image image-processor output; only the missing images are preprocessed, in one call.

        Entries live in the pixel-only level under the key of a one-image list, so
        ``get_pixel_values([image])`` finds them too.

        Args:
            images: a sequence of images: PIL images, numpy arrays or tensors, file paths,
                bytes, base64 or ``data:`` URLs (docs/inputs.md).
            preprocess_fn: ``(images) -> entries``, one `PixelOnlyCacheEntry` per image given.

        Returns:
            One `PixelOnlyCacheEntry` per image, in input order.

        Raises:
            UnsupportedImageTypeError: ``images`` is not a list/tuple, or holds an unsupported type.
            InvalidImageError: an image cannot be read (a missing file, bad base64, a non-image).
            ImageTooLargeError: an image is larger than ``max_image_bytes``.
            EncoderOutputError: ``preprocess_fn`` returned another number of entries than images.
        """
        keys = self._keys.image_keys("pixel_only", images)
        if not keys:
            return []
        if not self.enabled:
            return as_results(preprocess_fn(list(images)), len(keys), "preprocess_fn")
        return self._levels["pixel_only"].resolve(keys, list(images), preprocess_fn, what="preprocess_fn")

    def discard_images(self, images: Sequence[Any], *, flush_seconds: float = 10.0) -> int:
        """Remove these images' per-image entries (embeddings, pixel values) from memory and
        from every tier, under every secret the tiers accept (a purge).

        Writes still queued for the tiers are flushed first (up to ``flush_seconds``), so none
        lands after the removal. Entries of the prompt-keyed levels are not per image.

        Args:
            images: a sequence of images: PIL images, numpy arrays or tensors, file paths,
                bytes, base64 or ``data:`` URLs (docs/inputs.md).
            flush_seconds: how long to wait for queued tier writes first.

        Returns:
            How many stored copies were removed (memory and tiers).

        Raises:
            UnsupportedImageTypeError: ``images`` is not a list/tuple, or holds an unsupported type.
            InvalidImageError: an image cannot be read (a missing file, bad base64, a non-image).
            ImageTooLargeError: an image is larger than ``max_image_bytes``.
        """
        keys = [
            (self._levels[level], self._keys.builder.image_key(level, digest))
            for digest in self.image_digests(images)
            for level in ("embedding", "pixel_only")
        ]
        if self._tiers is not None:
            self._tiers.flush(flush_seconds)
        return sum(level.discard(key) for level, key in keys)

    @contextmanager
    def pinned(self, images: Sequence[Any]) -> Iterator[None]:
        """Keep these images' embedding and pixel-only entries from eviction inside the block.

        Pins may be taken before the entries exist (a request pins its images at admission, then
        encodes them). Pinned entries are never evicted; when they alone fill a level's budget,
        new values for that level are returned to their callers but not stored (rejections).
        """
        pins = [
            (self._levels[level], self._keys.builder.image_key(level, digest))
            for digest in self.image_digests(images)
            for level in ("embedding", "pixel_only")
        ]
        for level, key in pins:
            level.pin(key)
        try:
            yield
        finally:
            for level, key in pins:
                level.unpin(key)

    # ---- the reference's levels (docs/reference-api.md), by `ReferenceLevels` ------------------
    get_pixel_cache = forward_to(ReferenceLevels.get_pixel_cache)
    set_pixel_cache = forward_to(ReferenceLevels.set_pixel_cache)
    get_pixel_values = forward_to(ReferenceLevels.get_pixel_values)
    set_pixel_values = forward_to(ReferenceLevels.set_pixel_values)
    get_encoding_cache = forward_to(ReferenceLevels.get_encoding_cache)
    set_encoding_cache = forward_to(ReferenceLevels.set_encoding_cache)

    # ---- stats ---------------------------------------------------------------------------------
    def snapshot(self) -> CacheStats:
        """Typed stats of every level and tier, taken now."""
        levels = {name: level.stats() for name, level in self._levels.items()}
        tiers = self._tiers.stats() if self._tiers is not None else None
        return CacheStats(levels=levels, tiers=tiers, images_processed=self._reference.images_processed)

    @property
    def stats(self) -> VisionCacheStats:
        """A snapshot of the reference's counters (hits/misses of the pixel and encoding levels)."""
        return VisionCacheStats.from_cache_stats(self.snapshot())

    def get_stats(self) -> dict[str, Any]:
        """`snapshot` flattened into the reference's dict (plus every level's counters)."""
        return self.snapshot().to_dict()

    def clear(self) -> None:
        """Empty every level and reset the stats (pins held by running requests stay)."""
        for level in self._levels.values():
            level.clear()
        self._reference.clear()
        self._keys.hasher.path_memo.clear()

    def __repr__(self) -> str:
        sizes = " ".join(
            f"{name}={len(self._levels[name].store)}/{self._levels[name].store.max_entries}"
            for name in ("pixel", "pixel_only", "encoding")
        )
        return f"<VisionEmbeddingCache {sizes}>"
