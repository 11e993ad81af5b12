"""PaliGemma on mlx-vlm: one image per prompt, opening it.

- **One image**: the image processor resizes it to the tower's square input (224 px in
  paligemma-3b-mix-224) and hands back its ``(3, S, S)`` pixels; every image has one layout.
- **Its placeholder**: as PaliGemma's processor expands a prompt holding ``<image>``: the marker
  becomes ``image_seq_length`` image tokens, ``<bos>`` follows the last image token, and the
  prompt ends in a newline.
- **One image, first**: mlx-vlm 0.7.10's PaliGemma encodes one image per prompt (its SigLIP
  encoder returns the first image of a batch) and places the features by position (row ``i`` at
  position ``i``), so it is right only for one image opening the prompt, PaliGemma's own format.
  A prompt with more images, or an image elsewhere, is refused (PlaceholderMismatchError) rather
  than served as mlx-vlm would serve it (the other images ignored).
- **What the model is fed**: `ScatteredFeatures`; the language model attends the whole prompt
  both ways (a prefix LM: ``use_bidirectional_attention``), so a prompt prefilled as a cached
  prefix plus a tail is never one prefill: no KV prefix is reused (`reusable_prefix`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from typing_extensions import override

from visioncache import PixelOnlyCacheEntry, PlaceholderMismatchError
from visioncache.integrations.mlx_vlm.families.base import ImageValue
from visioncache.integrations.mlx_vlm.families.scattered import ScatteredFeatures
from visioncache.integrations.mlx_vlm.imports import import_mlx
from visioncache.integrations.mlx_vlm.protocols import Model, Processor

__all__ = ["PaliGemma"]


class PaliGemma(ScatteredFeatures):
    """PaliGemma (one image per prompt, opening it)."""

    name = "PaliGemma"
    model_types: ClassVar[frozenset[str]] = frozenset({"paligemma"})
    processor_classes: ClassVar[frozenset[str]] = frozenset({"PaliGemmaProcessor"})
    positions = "1-D RoPE; the prompt attended both ways (prefix LM)"

    # ---- its placeholder ---------------------------------------------------------------------
    @override
    def image_text(self, processor: Processor, layout: Mapping[str, Any]) -> str:
        return self.placeholder(processor) * int(getattr(processor, "image_seq_length"))  # noqa: B009

    @override
    def probe_prompt(self, marker: str) -> str:
        return f"{marker}describe please"

    @override
    def check_prompt(self, processor: Processor, prompt: str, images: int) -> None:
        super().check_prompt(processor, prompt, images)
        token = self.placeholder(processor)
        if images > 1 or (images == 1 and not prompt.startswith(token)):
            raise PlaceholderMismatchError(
                "PaliGemma on mlx-vlm takes one image per prompt, opening it (mlx-vlm's encoder "
                "reads the first image of a prompt only and places features by position); this "
                + (f"prompt holds {images} images" if images > 1 else "prompt's image follows other text")
            )

    @override
    def expand_prompts(
        self, processor: Processor, prompts: Sequence[str], layouts: Sequence[Mapping[str, Any]]
    ) -> list[str]:
        token = self.placeholder(processor)
        bos: str = getattr(processor.tokenizer, "bos_token")  # noqa: B009
        expanded = []
        # PaliGemmaProcessor: <bos> after the last image token, a newline at the end.
        for prompt in super().expand_prompts(processor, prompts, layouts):
            cut = prompt.rfind(token) + len(token) if token in prompt else 0
            expanded.append(f"{prompt[:cut]}{bos}{prompt[cut:]}\n")
        return expanded

    @override
    def tokenize(
        self,
        processor: Processor,
        prompts: Sequence[str],
        layouts: Sequence[Mapping[str, Any]],
        *,
        add_special_tokens: bool = False,
    ) -> dict[str, Any]:
        # PaliGemmaProcessor wants images; its text call is the tokenizer's, as here.
        mx = import_mlx()
        outputs = processor.tokenizer(self.expand_prompts(processor, prompts, layouts), padding=True)
        return {name: mx.array(outputs[name]) for name in ("input_ids", "attention_mask")}

    @override
    def token_count(self, model: Model, layout: Mapping[str, Any]) -> int:
        vision = getattr(model.config, "vision_config")  # noqa: B009
        return (int(vision.image_size) // int(vision.patch_size)) ** 2

    # ---- misses, batched ---------------------------------------------------------------------
    @override
    def encode(self, model: Model, entries: Sequence[PixelOnlyCacheEntry]) -> list[ImageValue]:
        mx = import_mlx()
        stacked = mx.stack([entry.pixel_values for entry in entries])
        pixels = stacked.astype(self.embedding_dtype(model))
        # The encoder's last hidden states, one image per row (its first output is the first
        # image's alone), through the post-layernorm and projector as the model's own path.
        tower = self.tower(model)
        _, _, states = tower(pixels.transpose(0, 2, 3, 1), output_hidden_states=True)
        hidden = tower.vision_model.post_layernorm(states[-1]).astype(stacked.dtype)
        return self.projected(model, hidden, len(entries))

    # ---- what the model is fed ---------------------------------------------------------------
    @override
    def reusable_prefix(
        self, model: Model, token_ids: Sequence[int], reused: int, stored: int | None
    ) -> bool:
        return False  # every position attends the whole prompt: a tail changes the prefix's KV
