"""visioncache: skip image preprocessing and vision-encoder work a multimodal LLM has already done.

The public API keeps the reference module's names (``vllm_mlx.vision_embedding_cache``) so code
written against it runs unchanged, and adds per-image embedding and preprocessing levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from visioncache.cache import VisionEmbeddingCache
from visioncache.content_id import ContentId
from visioncache.entries import EncodingCacheEntry, PixelCacheEntry, PixelOnlyCacheEntry
from visioncache.errors import (
    ConfigurationError,
    EncoderOutputError,
    ImageTooLargeError,
    InvalidArgumentError,
    InvalidImageError,
    PinMismatchError,
    PlaceholderMismatchError,
    UnsupportedImageTypeError,
    UnsupportedInputTypeError,
    VisionCacheError,
)
from visioncache.identity import ImageHasher
from visioncache.keys import DEFAULT_NAMESPACE
from visioncache.stats import CacheStats, VisionCacheStats
from visioncache.store import Store, StoreStats
from visioncache.tiers.chain import TierChain

__all__ = [
    "DEFAULT_NAMESPACE",
    "CacheStats",
    "ConfigurationError",
    "ContentId",
    "EncoderOutputError",
    "EncodingCacheEntry",
    "ImageTooLargeError",
    "InvalidArgumentError",
    "InvalidImageError",
    "PinMismatchError",
    "PixelCacheEntry",
    "PixelOnlyCacheEntry",
    "PlaceholderMismatchError",
    "Store",
    "StoreStats",
    "TierChain",
    "UnsupportedImageTypeError",
    "UnsupportedInputTypeError",
    "VisionCacheError",
    "VisionCacheStats",
    "VisionEmbeddingCache",
    "compute_image_hash",
    "compute_images_hash",
]

__version__ = "0.1.0"

_default_hasher = ImageHasher()


def compute_image_hash(image_path: Any) -> str:
    """The content digest of one image as 64 hex characters (256-bit blake3, framed by kind).

    Accepts every form in the README's "Accepted inputs": content (bytes, an existing file, a
    ``data:`` URL, raw base64 of media) has one digest in every form; an http(s) URL is hashed as
    a name; a PIL image or an array by its pixels; a `ContentId` is the caller's own identifier.
    """
    return _default_hasher.digest(image_path).hex()


def compute_images_hash(images: Sequence[Any]) -> str:
    """An order-sensitive digest of several images; ``"no_images"`` for an empty list."""
    from visioncache.keys import KeyBuilder

    digests = [_default_hasher.digest(image) for image in images]
    if not digests:
        return "no_images"
    return KeyBuilder().key("images", digests).rsplit("/", 1)[1]
