"""The Qwen-VL families on mlx-vlm: Qwen2-VL, Qwen2.5-VL, Qwen3-VL (with deepstack), Qwen3.5.

- **One image**: the image processor turns it into rows of flattened patches and a grid
  ``(t, h, w)``; rows of several images are concatenated, one grid row per image.
- **Its placeholder**: ``<|image_pad|>`` becomes ``t*h*w // merge_size**2`` copies of itself
  (the chat template's ``<|vision_start|>``/``<|vision_end|>`` stay around them).
- **Misses, batched**: the towers attend within each image only (block-diagonal attention over
  the grids), so one call over many images gives each image's rows as alone (the self-check
  proves it on the loaded model); each image owns ``t*h*w // merge_size**2`` output rows. The
  Qwen3-VL tower also returns one *deepstack* feature per tapped layer (the same rows), which its
  language model adds to the hidden states of its first layers: they are cached with the image.
- **What the model is fed**: the input embeddings with the features scattered in by the model's
  own ``get_input_embeddings(..., cached_image_features=...)``, M-RoPE positions from the grids;
  Qwen3-VL also gets ``visual_pos_masks`` and the deepstack features, which mlx-vlm's hook drops.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from typing_extensions import override

from visioncache import PixelOnlyCacheEntry
from visioncache.integrations.mlx_vlm.families.base import Family, Feed, ImageValue, grid_tokens, split_rows
from visioncache.integrations.mlx_vlm.families.images import load_images
from visioncache.integrations.mlx_vlm.imports import import_mlx
from visioncache.integrations.mlx_vlm.protocols import Array, Model, Processor

__all__ = ["Qwen2VL", "Qwen3VL"]


class Qwen2VL(Family):
    """Qwen2-VL and Qwen2.5-VL: features through mlx-vlm's hook, M-RoPE."""

    name = "Qwen2-VL / Qwen2.5-VL"
    model_types: ClassVar[frozenset[str]] = frozenset({"qwen2_vl", "qwen2_5_vl"})
    processor_classes: ClassVar[frozenset[str]] = frozenset({"Qwen2VLProcessor", "Qwen2_5_VLProcessor"})
    positions = "M-RoPE (t, h, w per image token)"
    layout_fields: ClassVar[frozenset[str]] = frozenset({"image_grid_thw"})

    # ---- one image ---------------------------------------------------------------------------
    @override
    def preprocess(self, processor: Processor, images: Sequence[Any]) -> list[PixelOnlyCacheEntry]:
        mx = import_mlx()
        started = time.perf_counter()
        image_processor = processor.image_processor
        output = image_processor(images=load_images(images, image_processor))
        pixel_values = np.asarray(output["pixel_values"])
        grids = np.asarray(output["image_grid_thw"]).reshape(-1, 3)
        row_ends = np.cumsum(grids.prod(axis=1))
        # mx.array copies each image's rows into its own buffer, so evicting one entry frees
        # its memory and the entry's nbytes is what it really holds.
        per_image_rows = np.split(pixel_values, row_ends[:-1])
        seconds_per_image = (time.perf_counter() - started) / max(len(images), 1)
        return [
            PixelOnlyCacheEntry(
                pixel_values=mx.array(rows),
                image_grid_thw=mx.array(grid[None, :]),
                processing_time=seconds_per_image,
            )
            for rows, grid in zip(per_image_rows, grids, strict=True)
        ]

    @override
    def pixel_inputs(
        self, entries: Sequence[PixelOnlyCacheEntry], images_per_prompt: Sequence[int]
    ) -> dict[str, Any]:
        mx = import_mlx()
        return {
            "pixel_values": mx.concatenate([entry.pixel_values for entry in entries]),
            "image_grid_thw": mx.concatenate([entry.image_grid_thw for entry in entries]),
        }

    # ---- its placeholder ---------------------------------------------------------------------
    @override
    def marker(self, processor: Processor) -> str:
        # M-RoPE finds each image by the <|vision_start|> before it.
        return f"<|vision_start|>{self.placeholder(processor)}<|vision_end|>"

    @override
    def image_text(self, processor: Processor, layout: Mapping[str, Any]) -> str:
        merge_size = int(getattr(processor.image_processor, "merge_size"))  # noqa: B009
        return self.placeholder(processor) * grid_tokens(layout["image_grid_thw"], merge_size)

    @override
    def token_count(self, model: Model, layout: Mapping[str, Any]) -> int:
        return grid_tokens(layout["image_grid_thw"], _merge_size(model))

    # ---- misses, batched ---------------------------------------------------------------------
    @override
    def tower(self, model: Model) -> Any:
        return getattr(model, "vision_tower")  # noqa: B009

    def run_tower(self, model: Model, pixel_values: Array, grids: Array) -> tuple[Array, list[Array]]:
        """The tower's output rows (all images, in order) and its deepstack features (none)."""
        features = self.tower(model)(pixel_values, grids, output_hidden_states=False)
        return features, []

    @override
    def encode(self, model: Model, entries: Sequence[PixelOnlyCacheEntry]) -> list[ImageValue]:
        mx = import_mlx()
        grids = [entry.image_grid_thw for entry in entries]
        pixels = mx.concatenate([entry.pixel_values for entry in entries]).astype(self.tower_dtype(model))
        features, deepstack = self.run_tower(model, pixels, mx.concatenate(grids))
        mx.eval(features, deepstack)  # the tower's cost is paid now, not when a request reads it
        counts = [self.token_count(model, {"image_grid_thw": grid}) for grid in grids]
        values: list[ImageValue] = [
            {"image_features": rows, "image_grid_thw": grid}
            for rows, grid in zip(split_rows(features, counts), grids, strict=True)
        ]
        if deepstack:
            layers = [split_rows(layer, counts) for layer in deepstack]
            for index, value in enumerate(values):
                value["deepstack_features"] = mx.stack([layer[index] for layer in layers])
        return values

    # ---- what the model is fed ---------------------------------------------------------------
    def placeholder_pixels(self, model: Model) -> Array:
        """Zero rows of pixels: the model's image branch runs (and its M-RoPE state resets) only
        when ``pixel_values`` is not None, but with cached features it reads no pixel."""
        mx = import_mlx()
        vision = getattr(model.config, "vision_config")  # noqa: B009
        patch_dim = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        return mx.zeros((0, patch_dim), dtype=self.tower_dtype(model))

    @override
    def hook_inputs(self, model: Model, values: Sequence[ImageValue]) -> dict[str, Any]:
        mx = import_mlx()
        return {
            "pixel_values": self.placeholder_pixels(model),
            "image_grid_thw": mx.concatenate([value["image_grid_thw"] for value in values]),
            "cached_image_features": mx.concatenate([value["image_features"] for value in values]),
        }

    @override
    def feed(self, model: Model, input_ids: Array, hook: Mapping[str, Any]) -> Feed:
        embeddings = model.get_input_embeddings(input_ids, **hook)
        inputs = {"inputs_embeds": embeddings.inputs_embeds, "pixel_values": hook["pixel_values"]}
        inputs["image_grid_thw"] = hook["image_grid_thw"]
        return Feed(input_ids, inputs)

    @override
    def forward(self, model: Model, feed: Feed, *, cache: Any = None, mask: Array = None) -> Any:
        # Qwen2VL.Model.__call__: language_model(input_ids, inputs_embeds, mask, cache, pixel_values, ...)
        inputs = dict(feed.inputs)
        embeds = inputs.pop("inputs_embeds")
        return model.language_model(feed.input_ids, embeds, mask=mask, cache=cache, **inputs)

    @override
    def window(self, feed: Feed, start: int, end: int) -> dict[str, Any]:
        return {"inputs_embeds": feed.inputs_embeds[:, start:end]}


class Qwen3VL(Qwen2VL):
    """Qwen3-VL (deepstack features cached and fed) and Qwen3.5 (no deepstack; hybrid layers)."""

    name = "Qwen3-VL / Qwen3.5"
    model_types: ClassVar[frozenset[str]] = frozenset({"qwen3_vl", "qwen3_5"})
    processor_classes: ClassVar[frozenset[str]] = frozenset({"Qwen3VLProcessor"})
    positions = "interleaved M-RoPE (t, h, w per image token)"

    @override
    def run_tower(self, model: Model, pixel_values: Array, grids: Array) -> tuple[Array, list[Array]]:
        features, deepstack = self.tower(model)(pixel_values, grids)
        return features, list(deepstack or [])

    def deepstack_layers(self, model: Model) -> int:
        vision = getattr(model.config, "vision_config")  # noqa: B009
        return len(getattr(vision, "deepstack_visual_indexes", None) or [])

    @override
    def fits_extras(self, model: Model, value: Mapping[str, Any]) -> bool:
        layers = self.deepstack_layers(model)
        if not layers:
            return "deepstack_features" not in value
        rows, hidden = value["image_features"].shape
        return tuple(value.get("deepstack_features", _NO_ARRAY).shape) == (layers, rows, hidden)

    @override
    def hook_inputs(self, model: Model, values: Sequence[ImageValue]) -> dict[str, Any]:
        mx = import_mlx()
        inputs = super().hook_inputs(model, values)
        if self.deepstack_layers(model):
            # generate_step passes what get_input_embeddings leaves None through to the language
            # model, so this reaches it there; model(...) itself drops it (use `forward`).
            stacked = mx.concatenate([value["deepstack_features"] for value in values], axis=1)
            inputs["deepstack_visual_embeds"] = list(stacked)
        return inputs

    @override
    def feed(self, model: Model, input_ids: Array, hook: Mapping[str, Any]) -> Feed:
        # Qwen3VL.Model.__call__: the embedding outputs (positions, visual mask, deepstack) are
        # all language-model arguments (its get_input_embeddings sees no mask).
        hook = dict(hook)
        deepstack = hook.pop("deepstack_visual_embeds", None)
        embeddings = model.get_input_embeddings(input_ids, **hook)
        inputs = {name: value for name, value in embeddings.to_dict().items() if value is not None}
        if deepstack is not None:
            inputs["deepstack_visual_embeds"] = deepstack
        inputs["pixel_values"] = hook["pixel_values"]
        inputs["image_grid_thw"] = hook["image_grid_thw"]
        return Feed(input_ids, inputs)

    @override
    def forward(self, model: Model, feed: Feed, *, cache: Any = None, mask: Array = None) -> Any:
        return model.language_model(feed.input_ids, mask=mask, cache=cache, **feed.inputs)

    @override
    def window(self, feed: Feed, start: int, end: int) -> dict[str, Any]:
        window = super().window(feed, start, end)
        deepstack = feed.inputs.get("deepstack_visual_embeds")
        masks = feed.inputs.get("visual_pos_masks")
        if deepstack is None or masks is None:
            return window
        mx = import_mlx()
        visual = np.flatnonzero(np.array(masks[0]))  # positions of the image tokens (batch 1)
        rows = np.flatnonzero((visual >= start) & (visual < end))
        if rows.size:
            indices = mx.array(rows, dtype=mx.uint32)
            window["visual_pos_masks"] = masks[:, start:end]
            window["deepstack_visual_embeds"] = [layer[indices] for layer in deepstack]
        return window


_NO_ARRAY = np.zeros(0)


def _merge_size(model: Model) -> int:
    return int(getattr(model.config, "vision_config").spatial_merge_size)  # noqa: B009
