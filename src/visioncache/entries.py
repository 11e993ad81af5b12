"""The reference module's entry dataclasses, kept field for field (docs/reference-api.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["EncodingCacheEntry", "PixelCacheEntry", "PixelOnlyCacheEntry"]


@dataclass
class PixelCacheEntry:
    """Processor output for images + one prompt (the reference's prompt-keyed level)."""

    pixel_values: Any
    input_ids: Any
    attention_mask: Any | None = None
    image_grid_thw: Any | None = None
    extra_kwargs: dict[str, Any] = field(default_factory=dict)
    processing_time: float = 0.0


@dataclass
class PixelOnlyCacheEntry:
    """Image-processor output for images alone (prompt-independent)."""

    pixel_values: Any
    image_grid_thw: Any | None = None
    processing_time: float = 0.0


@dataclass
class EncodingCacheEntry:
    """A prefill result for images + one prompt (the reference's encoding level)."""

    logits: Any
    first_token: int
    logprobs: Any
    encoding_time: float = 0.0
