"""What Gemma 3, PaliGemma, LLaVA and Mistral 3 share on mlx-vlm: features scattered into the
input embeddings by the model's own ``get_input_embeddings``, a 1-D RoPE language model fed those
embeddings, as mlx-vlm's ``generate`` runs it.

- **What the model is fed**: ``get_input_embeddings(input_ids, pixel_values, mask=...,
  cached_image_features=...)`` merges the cached rows into the image tokens' positions (its own
  merge: Gemma 3 and PaliGemma scale them by the hidden size, PaliGemma places them by position),
  then the language model takes ``inputs_embeds`` and builds its own causal (and sliding-window)
  masks from the cache offset.
- **The model's own uncached path** is mlx-vlm's ``generate``'s, not ``model(...)``'s: ``generate``
  gives the padding mask to ``get_input_embeddings`` only, where Gemma 3's and PaliGemma's
  ``__call__`` give the language model their ``attention_mask_4d`` (every position attending
  every other one), and LLaVA's and Mistral 3's ``__call__`` take a ``mask`` vllm-mlx 0.6.0 does
  not pass (why stock vllm-mlx fails their image requests).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from typing_extensions import override

from visioncache import PixelOnlyCacheEntry
from visioncache.integrations.mlx_vlm.families.base import Family, Feed, ImageValue, split_rows
from visioncache.integrations.mlx_vlm.families.images import load_images
from visioncache.integrations.mlx_vlm.imports import import_mlx
from visioncache.integrations.mlx_vlm.protocols import Array, Model, Processor

__all__ = ["ScatteredFeatures", "generate_forward"]


def generate_forward(model: Model, inputs: Mapping[str, Any], *, cache: Any = None) -> Any:
    """The model's forward on ``mlx_vlm.utils.prepare_inputs`` output as mlx-vlm's
    ``generate_step`` runs its prefill: the embeddings from ``get_input_embeddings`` (given the
    padding mask), then the language model on them with the embedding's other outputs."""
    inputs = dict(inputs)
    input_ids, pixel_values = inputs.pop("input_ids"), inputs.pop("pixel_values")
    mask = inputs.pop("attention_mask", None)
    embeddings = model.get_input_embeddings(input_ids, pixel_values, mask=mask, **inputs)
    extra = {
        name: value
        for name, value in embeddings.to_dict().items()
        if name != "inputs_embeds" and value is not None
    }
    return model.language_model(input_ids, inputs_embeds=embeddings.inputs_embeds, cache=cache, **extra)


def size_layout(entry: PixelOnlyCacheEntry) -> Mapping[str, Any]:
    """The height and width of an image's pixels (channels first): LLaVA's and Mistral 3's layout."""
    _, height, width = entry.pixel_values.shape
    return {"height": int(height), "width": int(width)}


def pixel_entries(pixels: Sequence[Any], started: float) -> list[PixelOnlyCacheEntry]:
    """One entry per image's pixels (mlx), each charged an equal share of the time since ``started``."""
    mx = import_mlx()
    seconds_per_image = (time.perf_counter() - started) / max(len(pixels), 1)
    return [
        PixelOnlyCacheEntry(pixel_values=mx.array(array), processing_time=seconds_per_image)
        for array in pixels
    ]


class ScatteredFeatures(Family):
    """A family whose cached rows go through the model's own embedding merge (see the module)."""

    positions = "1-D RoPE"

    # ---- one image: one pixel tensor of the processor's fixed size (Gemma 3, PaliGemma, LLaVA) ----
    @override
    def preprocess(self, processor: Processor, images: Sequence[Any]) -> list[PixelOnlyCacheEntry]:
        started = time.perf_counter()
        image_processor = processor.image_processor
        pixels = np.asarray(image_processor(load_images(images, image_processor))["pixel_values"])
        return pixel_entries(list(pixels), started)

    @override
    def pixel_inputs(
        self, entries: Sequence[PixelOnlyCacheEntry], images_per_prompt: Sequence[int]
    ) -> dict[str, Any]:
        mx = import_mlx()
        return {"pixel_values": mx.stack([entry.pixel_values for entry in entries])}

    def projected(self, model: Model, hidden: Array, images: int) -> list[ImageValue]:
        """The projector's rows of ``images`` images' tower states, evaluated, one value per image
        (each image the family's fixed `token_count` rows)."""
        mx = import_mlx()
        features = getattr(model, "multi_modal_projector")(hidden)  # noqa: B009
        mx.eval(features)
        count = self.token_count(model, {})
        rows = split_rows(features.reshape(-1, features.shape[-1]), [count] * images)
        return [{"image_features": part} for part in rows]

    @override
    def tower(self, model: Model) -> Any:
        return getattr(model, "vision_tower")  # noqa: B009

    def embedding_dtype(self, model: Model) -> Any:
        """The dtype of the language model's input embeddings (Gemma 3's and PaliGemma's own
        path casts pixels to it before the tower)."""
        mx = import_mlx()
        embed_tokens = getattr(model.language_model, "model").embed_tokens  # noqa: B009
        return embed_tokens(mx.zeros((1, 1), dtype=mx.int32)).dtype

    @override
    def hook_inputs(self, model: Model, values: Sequence[ImageValue]) -> dict[str, Any]:
        mx = import_mlx()
        features = mx.concatenate([value["image_features"] for value in values])
        return {
            # get_input_embeddings merges features only when pixel_values is set; it reads none.
            "pixel_values": mx.zeros((0,), dtype=self.tower_dtype(model)),
            "cached_image_features": features[None],
        }

    @override
    def feed(self, model: Model, input_ids: Array, hook: Mapping[str, Any]) -> Feed:
        mx = import_mlx()
        hook = dict(hook)
        pixel_values = hook.pop("pixel_values")
        mask = mx.ones(input_ids.shape, dtype=mx.int32)  # what the merge reads; no padding here
        embeddings = model.get_input_embeddings(input_ids, pixel_values, mask=mask, **hook)
        return Feed(input_ids, {"inputs_embeds": embeddings.inputs_embeds})

    @override
    def uncached_forward(self, model: Model, inputs: Mapping[str, Any]) -> Any:
        return generate_forward(model, inputs)

    @override
    def forward(self, model: Model, feed: Feed, *, cache: Any = None, mask: Array = None) -> Any:
        # As generate_step: the language model builds its masks (a padding mask is not one).
        # Gemma 3's scales its inputs_embeds in place (``h *= ...``): it gets its own copy, so
        # the feed a KV prefix hit's `window` reads later is not scaled twice.
        mx = import_mlx()
        embeds = mx.array(feed.inputs_embeds)
        return model.language_model(feed.input_ids, inputs_embeds=embeds, cache=cache)

    @override
    def window(self, feed: Feed, start: int, end: int) -> dict[str, Any]:
        return {"inputs_embeds": feed.inputs_embeds[:, start:end]}
