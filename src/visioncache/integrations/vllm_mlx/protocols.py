"""What the integration reads and writes of vllm-mlx's objects, as Protocols (types only).

vllm-mlx ships no type hints; these name the members the integration uses, so its code is checked
against them instead of `Any`. Each member is a seam in `compat.SEAMS` (the request's fields are
the table's ``MLLMBatchRequest`` fields), and `compat.checked_module` checks them at start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from visioncache import VisionEmbeddingCache
from visioncache.integrations.mlx_vlm import Model, Processor

__all__ = ["GENERATOR_STATE", "BatchGenerator", "BatchRequest", "Scheduler"]

GENERATOR_STATE = "_visioncache_state"  # set on a generator visioncache serves: its EngineState


class BatchRequest(Protocol):
    """vllm-mlx's ``MLLMBatchRequest`` (a dataclass): one request in the batch generator."""

    request_id: str
    prompt: str
    images: Sequence[Any] | None
    videos: Sequence[Any] | None
    audio: Sequence[Any] | None
    input_ids: Any  # an mlx array once prepared
    attention_mask: Any
    pixel_values: Any
    image_grid_thw: Any
    extra_kwargs: dict[str, Any]
    is_text_only: bool
    vision_encoded: bool


class BatchGenerator(Protocol):
    """vllm-mlx's ``MLLMBatchGenerator``: what the replacements read and set on it."""

    model: Model
    processor: Processor
    vision_cache: VisionEmbeddingCache
    prefix_cache: Any  # vllm-mlx's prefix cache, or `ImageAwarePrefixCache` around it, or None

    def _release_preprocessed_inputs(self, request: BatchRequest) -> None: ...


class Scheduler(Protocol):
    """vllm-mlx's ``MLLMScheduler``: built at server start with the loaded model."""

    model: Model
    processor: Processor
