"""Gemma 4 on mlx-vlm.

- **One image**: the image processor resizes it (aspect ratio kept) to at most
  ``max_soft_tokens * pooling_kernel_size**2`` patches, both sides multiples of
  ``pooling_kernel_size * patch_size``, and hands back its ``(3, H, W)`` pixels; the layout is
  its patch grid ``(1, H / patch_size, W / patch_size)``, so images of other aspect ratios get
  other soft-token counts.
- **Its placeholder**: ``<|image|>`` becomes ``<|image>`` + ``<|image|>`` x soft tokens +
  ``<image|>`` (the grid's patches pooled ``pooling_kernel_size`` x ``pooling_kernel_size``).
- **Misses, batched**: the tower encodes a list of images one by one inside ONE call (its own
  path for images of different sizes), so each image's rows are its rows alone; the features are
  the tower's output through the model's ``embed_vision`` projection, as ``encode_image`` gives
  them.
- **What the model is fed**: the input embeddings with the features scattered in by the model's
  own ``get_input_embeddings(..., cached_image_features=...)``, which also gives the per-layer
  inputs (image tokens read as token 0), and ``mm_token_type_ids``: where the configuration says
  ``use_bidirectional_attention="vision"``, the language model lets the tokens of one image
  attend to each other both ways. Positions are 1-D (the cache offset); sliding-window and global
  layers alternate. The language model reads no padding mask (mlx-vlm's ``generate`` and
  vllm-mlx pass none), so neither does `Gemma4.forward`.
- **A span of positions** (`window`, a KV prefix hit's tail): its embeddings and per-layer
  inputs; where the tail holds an image and attention is bidirectional within images, also the
  mask the whole prompt's prefill gives its rows (causal, plus each image's block), which one
  mask can state for every layer only while the prompt fits in the sliding window
  (`Gemma4.reusable_prefix` says where a split is exact; elsewhere the engine prefills whole).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from typing_extensions import override

from visioncache import PixelOnlyCacheEntry
from visioncache.integrations.mlx_vlm.families.base import Family, Feed, ImageValue, split_rows
from visioncache.integrations.mlx_vlm.families.images import load_images
from visioncache.integrations.mlx_vlm.imports import import_mlx
from visioncache.integrations.mlx_vlm.protocols import Array, Model, Processor

__all__ = ["Gemma4"]

_IMAGE = 1  # mm_token_type_ids of an image token (2: a video frame's)


@dataclass
class Gemma4Feed(Feed):
    """A Gemma 4 prompt's inputs, and whether its image tokens attend both ways."""

    bidirectional: bool = False


class Gemma4(Family):
    """Gemma 4 (text + vision; audio and video keep mlx-vlm's own path)."""

    name = "Gemma 4"
    model_types: ClassVar[frozenset[str]] = frozenset({"gemma4"})
    processor_classes: ClassVar[frozenset[str]] = frozenset({"Gemma4Processor"})
    positions = "1-D RoPE; sliding-window and global layers; bidirectional within an image"

    # ---- one image ---------------------------------------------------------------------------
    @override
    def preprocess(self, processor: Processor, images: Sequence[Any]) -> list[PixelOnlyCacheEntry]:
        mx = import_mlx()
        started = time.perf_counter()
        image_processor = processor.image_processor
        data, _ = image_processor(load_images(images, image_processor))
        patch = int(getattr(image_processor, "patch_size"))  # noqa: B009
        seconds_per_image = (time.perf_counter() - started) / max(len(images), 1)
        entries = []
        for pixels in data["pixel_values"]:  # (N, 3, H, W) stacked, or a list of (3, H, W)
            array = np.asarray(pixels)
            grid = mx.array([[1, array.shape[-2] // patch, array.shape[-1] // patch]])
            entries.append(
                PixelOnlyCacheEntry(
                    pixel_values=mx.array(array), image_grid_thw=grid, processing_time=seconds_per_image
                )
            )
        return entries

    @override
    def pixel_inputs(
        self, entries: Sequence[PixelOnlyCacheEntry], images_per_prompt: Sequence[int]
    ) -> dict[str, Any]:
        # As the image processor hands them: stacked when every image has one shape, else a list.
        mx = import_mlx()
        pixels = [entry.pixel_values for entry in entries]
        if len({tuple(array.shape) for array in pixels}) == 1:
            return {"pixel_values": mx.stack(pixels)}
        return {"pixel_values": pixels}

    # ---- its placeholder ---------------------------------------------------------------------
    @override
    def image_text(self, processor: Processor, layout: Mapping[str, Any]) -> str:
        kernel = int(getattr(processor.image_processor, "pooling_kernel_size"))  # noqa: B009
        tokens = _soft_tokens(layout, kernel)
        boi, eoi = getattr(processor, "boi_token"), getattr(processor, "eoi_token")  # noqa: B009
        return f"{boi}{self.placeholder(processor) * tokens}{eoi}"

    @override
    def token_count(self, model: Model, layout: Mapping[str, Any]) -> int:
        return _soft_tokens(layout, int(_vision(model).pooling_kernel_size))

    # ---- misses, batched ---------------------------------------------------------------------
    @override
    def tower(self, model: Model) -> Any:
        return getattr(model, "vision_tower")  # noqa: B009

    @override
    def encode(self, model: Model, entries: Sequence[PixelOnlyCacheEntry]) -> list[ImageValue]:
        mx = import_mlx()
        dtype = self.tower_dtype(model)
        pixels = [entry.pixel_values[None].astype(dtype) for entry in entries]
        # Gemma4 VisionModel: a list is encoded image by image in one call; embed_vision projects.
        features = getattr(model, "embed_vision")(self.tower(model)(pixels))[0]  # noqa: B009
        mx.eval(features)
        grids = [entry.image_grid_thw for entry in entries]
        counts = [self.token_count(model, {"image_grid_thw": grid}) for grid in grids]
        return [
            {"image_features": rows, "image_grid_thw": grid}
            for rows, grid in zip(split_rows(features, counts), grids, strict=True)
        ]

    # ---- what the model is fed ---------------------------------------------------------------
    @override
    def hook_inputs(self, model: Model, values: Sequence[ImageValue]) -> dict[str, Any]:
        mx = import_mlx()
        return {
            # Gemma4's get_input_embeddings reads cached features only when pixel_values is set.
            "pixel_values": mx.zeros((0,), dtype=self.tower_dtype(model)),
            "cached_image_features": mx.concatenate([value["image_features"] for value in values]),
        }

    @override
    def feed(self, model: Model, input_ids: Array, hook: Mapping[str, Any]) -> Feed:
        hook = dict(hook)
        token_types = hook.pop("mm_token_type_ids", None)
        if token_types is None:
            token_types = (input_ids == self.image_token_id(model)).astype(input_ids.dtype) * _IMAGE
        embeddings = model.get_input_embeddings(input_ids, **hook)
        inputs = {name: value for name, value in embeddings.to_dict().items() if value is not None}
        inputs["mm_token_type_ids"] = token_types
        text = getattr(model.config, "text_config")  # noqa: B009
        bidirectional = getattr(text, "use_bidirectional_attention", None) == "vision"
        return Gemma4Feed(input_ids, inputs, bidirectional=bidirectional)

    @override
    def uncached_forward(self, model: Model, inputs: Mapping[str, Any]) -> Any:
        # mlx-vlm's generate gives the padding mask to get_input_embeddings only, vllm-mlx as
        # ``attention_mask=``: Gemma 4's language model builds its own masks. (``mask=`` would
        # be used as every layer's attention mask.)
        inputs = dict(inputs)
        input_ids, pixel_values = inputs.pop("input_ids"), inputs.pop("pixel_values")
        return model(input_ids, pixel_values, **inputs)

    @override
    def forward(self, model: Model, feed: Feed, *, cache: Any = None, mask: Array = None) -> Any:
        # Gemma4 Model.__call__: language_model(None, inputs_embeds, per_layer_inputs, ...); the
        # masks are the language model's own (a padding mask is not one of them).
        return model.language_model(None, cache=cache, **feed.inputs)

    @override
    def window(self, feed: Feed, start: int, end: int) -> dict[str, Any]:
        window: dict[str, Any] = {"inputs_embeds": feed.inputs_embeds[:, start:end]}
        per_layer = feed.inputs.get("per_layer_inputs")
        if per_layer is not None:
            window["per_layer_inputs"] = per_layer[:, start:end]
        token_types = np.array(feed.inputs["mm_token_type_ids"][0])
        if getattr(feed, "bidirectional", False) and start > 0 and np.any(token_types[start:end] > 0):
            window["mask"] = _block_mask(token_types, start, end)
        return window

    @override
    def reusable_prefix(
        self, model: Model, token_ids: Sequence[int], reused: int, stored: int | None
    ) -> bool:
        # vllm-mlx reruns the last token of a prompt cached whole (a one-token tail).
        start, end = min(reused, len(token_ids) - 1), len(token_ids)
        text = getattr(model.config, "text_config")  # noqa: B009
        window = int(text.sliding_window) if "sliding_attention" in (text.layer_types or ()) else None
        if window is not None and (stored is None or stored > window):
            # A stored entry past the window has rotated: its sliding layers no longer hold
            # the keys a whole prefill attends (vllm-mlx pads what it trimmed away with zeros).
            return False
        image = self.image_token_id(model)
        if start > 0 and token_ids[start - 1] == image and token_ids[start] == image:
            return False  # inside an image: its first tokens did not see its last ones
        if window is None or end <= window:
            return True  # every layer attends the whole prompt: one mask states it (`window`)
        bidirectional = getattr(text, "use_bidirectional_attention", None) == "vision"
        tail_holds_image = image in token_ids[start:]
        # Past the window, the tail's sliding layers take their own mask (one mask cannot state
        # both kinds), which has no image block; one token is attended by another kernel.
        return end - start >= 2 and not (bidirectional and tail_holds_image)


def _vision(model: Model) -> Any:
    return getattr(model.config, "vision_config")  # noqa: B009


def _soft_tokens(layout: Mapping[str, Any], kernel: int) -> int:
    _, height, width = (int(side) for side in layout["image_grid_thw"].reshape(-1).tolist())
    return (height * width) // kernel**2


def _block_mask(token_types: Any, start: int, end: int) -> Array:
    """Rows ``[start, end)`` of the whole prompt's mask: causal, plus both ways within each run
    of image tokens (Gemma4TextModel's bidirectional-vision overlay), shape (1, 1, L, end)."""
    mx = import_mlx()
    vision = token_types[:end] > 0
    starts = vision & ~np.concatenate([[False], vision[:-1]])
    blocks = np.where(vision, np.cumsum(starts) - 1, -1)
    rows, columns = np.arange(start, end)[:, None], np.arange(end)[None, :]
    same_block = (blocks[rows] != -1) & (blocks[rows] == blocks[columns])
    return mx.array((rows >= columns) | same_block)[None, None]
