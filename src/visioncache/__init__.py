"""visioncache: skip image preprocessing and vision-encoder work a multimodal LLM has already done.

The public API keeps the reference module's names (``vllm_mlx.vision_embedding_cache``) so code
written against it runs unchanged, and adds per-image embedding and preprocessing levels.
"""

from __future__ import annotations

from visioncache.cache import VisionEmbeddingCache
from visioncache.entries import EncodingCacheEntry, PixelCacheEntry, PixelOnlyCacheEntry
from visioncache.errors import (
    ConfigurationError,
    EncoderOutputError,
    ImageTooLargeError,
    InvalidArgumentError,
    InvalidImageError,
    MissingExtraError,
    PinMismatchError,
    PlaceholderMismatchError,
    UnsupportedImageTypeError,
    UnsupportedInputTypeError,
    VisionCacheError,
)
from visioncache.identity import (
    DEFAULT_NAMESPACE,
    ContentDigest,
    ContentId,
    compute_image_hash,
    compute_images_hash,
)
from visioncache.stats import CacheStats, VisionCacheStats
from visioncache.store import Store, StoreStats
from visioncache.tiers import TierChain, TierSettings

__all__ = [
    "DEFAULT_NAMESPACE",
    "CacheStats",
    "ConfigurationError",
    "ContentDigest",
    "ContentId",
    "EncoderOutputError",
    "EncodingCacheEntry",
    "ImageTooLargeError",
    "InvalidArgumentError",
    "InvalidImageError",
    "MissingExtraError",
    "PinMismatchError",
    "PixelCacheEntry",
    "PixelOnlyCacheEntry",
    "PlaceholderMismatchError",
    "Store",
    "StoreStats",
    "TierChain",
    "TierSettings",
    "UnsupportedImageTypeError",
    "UnsupportedInputTypeError",
    "VisionCacheError",
    "VisionCacheStats",
    "VisionEmbeddingCache",
    "compute_image_hash",
    "compute_images_hash",
]

__version__ = "0.1.0"
