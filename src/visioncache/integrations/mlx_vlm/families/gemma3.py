"""Gemma 3 on mlx-vlm.

- **One image**: the image processor resizes it to the tower's square input (896 px in the
  released checkpoints) and hands back its ``(3, S, S)`` pixels; every image has the same layout
  (no pan-and-scan crops: a processor set to make them is refused, its crops would change the
  prompt).
- **Its placeholder**: ``<start_of_image>`` becomes the processor's own full image sequence
  (``\\n\\n<start_of_image>`` + ``mm_tokens_per_image`` soft tokens + ``<end_of_image>\\n\\n``).
- **Misses, batched**: the SigLIP tower encodes a batch of images, each on its own (no attention
  across the batch); the projector average-pools each image's patches to its soft tokens.
- **What the model is fed**: `ScatteredFeatures` (the model's merge scales the rows by the hidden
  size); sliding-window layers and a global layer alternate, all causal in mlx-vlm 0.7.10 (its
  ``generate`` gives the language model no mask, so image tokens attend as text does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from typing_extensions import override

from visioncache import ConfigurationError, PixelOnlyCacheEntry
from visioncache.integrations.mlx_vlm.families.base import ImageValue
from visioncache.integrations.mlx_vlm.families.scattered import ScatteredFeatures
from visioncache.integrations.mlx_vlm.imports import import_mlx
from visioncache.integrations.mlx_vlm.protocols import Model, Processor

__all__ = ["Gemma3", "sliding_window_allows"]


class Gemma3(ScatteredFeatures):
    """Gemma 3 (text + vision)."""

    name = "Gemma 3"
    model_types: ClassVar[frozenset[str]] = frozenset({"gemma3"})
    processor_classes: ClassVar[frozenset[str]] = frozenset({"Gemma3Processor"})
    positions = "1-D RoPE; sliding-window and global layers"

    # ---- one image ---------------------------------------------------------------------------
    @override
    def preprocess(self, processor: Processor, images: Sequence[Any]) -> list[PixelOnlyCacheEntry]:
        if getattr(processor.image_processor, "do_pan_and_scan", None):
            raise ConfigurationError(
                "Gemma 3 with pan-and-scan crops is not supported by visioncache's mlx-vlm "
                "integration (the crops change the prompt); set do_pan_and_scan=False"
            )
        return super().preprocess(processor, images)

    # ---- its placeholder ---------------------------------------------------------------------
    @override
    def placeholder(self, processor: Processor) -> str:
        token: str = getattr(processor, "boi_token")  # noqa: B009 - the processor expands it
        return token

    @override
    def image_text(self, processor: Processor, layout: Mapping[str, Any]) -> str:
        sequence: str = getattr(processor, "full_image_sequence")  # noqa: B009
        return sequence

    @override
    def token_count(self, model: Model, layout: Mapping[str, Any]) -> int:
        return int(getattr(model.config, "text_config").mm_tokens_per_image)  # noqa: B009

    # ---- misses, batched ---------------------------------------------------------------------
    @override
    def encode(self, model: Model, entries: Sequence[PixelOnlyCacheEntry]) -> list[ImageValue]:
        mx = import_mlx()
        pixels = mx.stack([entry.pixel_values for entry in entries]).astype(self.embedding_dtype(model))
        hidden, _, _ = self.tower(model)(pixels.transpose(0, 2, 3, 1), output_hidden_states=True)
        return self.projected(model, hidden, len(entries))

    # ---- what the model is fed ---------------------------------------------------------------
    @override
    def reusable_prefix(
        self, model: Model, token_ids: Sequence[int], reused: int, stored: int | None
    ) -> bool:
        return sliding_window_allows(getattr(model.config, "text_config"), token_ids, reused, stored)  # noqa: B009


def sliding_window_allows(text: Any, token_ids: Sequence[int], reused: int, stored: int | None) -> bool:
    """A causal language model's KV prefix hit with sliding-window layers (``sliding_window``,
    a global layer every ``sliding_window_pattern``) is exact only from a stored entry within the
    window (one past it has rotated: vllm-mlx pads what its sliding layers trimmed with zeros);
    past the window, a tail of one token is attended by another kernel than one prefill's."""
    window = int(getattr(text, "sliding_window", 0) or 0)
    if not window or int(getattr(text, "sliding_window_pattern", 1)) <= 1:
        return True
    if stored is None or stored > window:
        return False
    start, end = min(reused, len(token_ids) - 1), len(token_ids)
    return end <= window or end - start >= 2
