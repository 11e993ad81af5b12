"""Idefics3 and SmolVLM (SmolVLM2's layout) on mlx-vlm: tiles, row/column tokens, 1-D RoPE.

- **One image**: resized, split into ``rows x cols`` tiles of the tower's input size plus a
  global view (or the global view alone for a small image): ``(tiles, C, S, S)`` pixels and their
  ``pixel_attention_mask``, with ``rows`` and ``cols`` as its layout.
- **Its placeholder**: ``<image>`` becomes, per tile, ``<fake_token_around_image><row_r_col_c>``
  and ``image_seq_len`` image tokens, rows ending in a newline, then the global view's
  ``<fake_token_around_image><global-img>`` run (the processor module's own function).
- **Misses, batched**: the tower encodes tiles, each independently (a batch axis, no attention
  across tiles); the tiles of all missing images go through one call of the model's own
  ``get_input_embeddings`` (so its padding removal, patch mask and connector are the model's),
  and each image owns ``tiles * image_seq_len`` rows.
- **What the model is fed**: the input embeddings with the rows scattered in by the model's own
  merge; its Llama language model takes positions from the cache offset (1-D RoPE).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from typing_extensions import override

from visioncache import PixelOnlyCacheEntry
from visioncache.integrations.mlx_vlm.families.base import Family, Feed, ImageValue, split_rows
from visioncache.integrations.mlx_vlm.families.images import load_images
from visioncache.integrations.mlx_vlm.imports import import_mlx
from visioncache.integrations.mlx_vlm.protocols import Array, Model, Processor

__all__ = ["Idefics3", "SmolVLM"]


def _tiles(layout: Mapping[str, Any]) -> int:
    rows, cols = int(layout["rows"]), int(layout["cols"])
    return rows * cols + 1 if rows else 1


class Idefics3(Family):
    """Idefics3: tiles + global view; features through the model's own embedding merge."""

    name = "Idefics3"
    model_types: ClassVar[frozenset[str]] = frozenset({"idefics3"})
    processor_classes: ClassVar[frozenset[str]] = frozenset({"Idefics3Processor"})
    # mlx-vlm's module expanding the placeholder, and its keyword and the processor's attribute
    # for the global image's token (the two families spell them differently)
    prompt_module: ClassVar[str] = "mlx_vlm.models.idefics3.processing_idefics3"
    global_token: ClassVar[tuple[str, str]] = ("global_img_token", "global_image_tag")
    positions = "1-D RoPE"

    # ---- one image ---------------------------------------------------------------------------
    @override
    def preprocess(self, processor: Processor, images: Sequence[Any]) -> list[PixelOnlyCacheEntry]:
        mx = import_mlx()
        started = time.perf_counter()
        image_processor = processor.image_processor
        # One sample per image: its tiles come first, zero tiles pad it to the largest sample.
        loaded = [[image] for image in load_images(images, image_processor)]
        output = image_processor(loaded, return_row_col_info=True)
        pixels, masks = np.asarray(output["pixel_values"]), np.asarray(output["pixel_attention_mask"])
        seconds_per_image = (time.perf_counter() - started) / max(len(images), 1)
        entries = []
        for index, ([rows], [cols]) in enumerate(zip(output["rows"], output["cols"], strict=True)):
            tiles = _tiles({"rows": rows, "cols": cols})
            values = {
                "pixel_values": mx.array(pixels[index, :tiles]),
                "pixel_attention_mask": mx.array(masks[index, :tiles]),
                "rows": int(rows),
                "cols": int(cols),
            }
            entries.append(PixelOnlyCacheEntry(pixel_values=values, processing_time=seconds_per_image))
        return entries

    @override
    def pixel_layout(self, entry: PixelOnlyCacheEntry) -> Mapping[str, Any]:
        return {"rows": entry.pixel_values["rows"], "cols": entry.pixel_values["cols"]}

    @override
    def pixel_inputs(
        self, entries: Sequence[PixelOnlyCacheEntry], images_per_prompt: Sequence[int]
    ) -> dict[str, Any]:
        mx = import_mlx()
        samples, start = [], 0
        for count in images_per_prompt:
            samples.append(entries[start : start + count])
            start += count
        first = entries[0].pixel_values
        widest = max(
            sum(int(entry.pixel_values["pixel_values"].shape[0]) for entry in sample) for sample in samples
        )
        pixels, masks = [], []
        for sample in samples:  # each padded with zero tiles to the widest, as the processor pads
            tiles = [entry.pixel_values["pixel_values"] for entry in sample]
            tile_masks = [entry.pixel_values["pixel_attention_mask"] for entry in sample]
            padding = widest - sum(int(tile.shape[0]) for tile in tiles)
            if padding:
                for parts, like in (
                    (tiles, first["pixel_values"]),
                    (tile_masks, first["pixel_attention_mask"]),
                ):
                    parts.append(mx.zeros((padding, *like.shape[1:]), dtype=like.dtype))
            pixels.append(mx.concatenate(tiles))
            masks.append(mx.concatenate(tile_masks))
        return {"pixel_values": mx.stack(pixels), "pixel_attention_mask": mx.stack(masks)}

    # ---- its placeholder ---------------------------------------------------------------------
    @override
    def image_text(self, processor: Processor, layout: Mapping[str, Any]) -> str:
        module: Any = importlib.import_module(self.prompt_module)
        keyword, attribute = self.global_token
        text: str = module.get_image_prompt_string(
            int(layout["rows"]),
            int(layout["cols"]),
            getattr(processor, "image_seq_len"),  # noqa: B009
            fake_token_around_image=getattr(processor, "fake_image_token"),  # noqa: B009
            image_token=self.placeholder(processor),
            **{keyword: getattr(processor, attribute)},
        )
        return text

    @override
    def tokenize(
        self,
        processor: Processor,
        prompts: Sequence[str],
        layouts: Sequence[Mapping[str, Any]],
        *,
        add_special_tokens: bool = False,
    ) -> dict[str, Any]:
        # The processor refuses image tokens without images, so tokenise as it does once it has
        # expanded them: its tokenizer with padding, arrays converted by mlx-vlm's to_mlx.
        base: Any = importlib.import_module("mlx_vlm.models.base")
        expanded = self.expand_prompts(processor, prompts, layouts)
        outputs = processor.tokenizer(expanded, padding=True)
        converted: dict[str, Any] = base.to_mlx(
            {name: outputs[name] for name in ("input_ids", "attention_mask")}
        )
        return converted

    @override
    def token_count(self, model: Model, layout: Mapping[str, Any]) -> int:
        return _tiles(layout) * _tokens_per_tile(model)

    # ---- misses, batched ---------------------------------------------------------------------
    @override
    def tower(self, model: Model) -> Any:
        return getattr(model, "vision_model")  # noqa: B009

    @override
    def encode(self, model: Model, entries: Sequence[PixelOnlyCacheEntry]) -> list[ImageValue]:
        mx = import_mlx()
        pixels = mx.concatenate([entry.pixel_values["pixel_values"] for entry in entries])[None]
        masks = mx.concatenate([entry.pixel_values["pixel_attention_mask"] for entry in entries])[None]
        layouts = [self.pixel_layout(entry) for entry in entries]
        counts = [self.token_count(model, layout) for layout in layouts]
        # A prompt of image tokens only: the embeddings the model's own path scatters into them.
        ids = mx.full((1, sum(counts)), self.image_token_id(model), dtype=mx.int32)
        embeddings = model.get_input_embeddings(ids, pixels, pixel_attention_mask=masks).inputs_embeds[0]
        mx.eval(embeddings)
        return [
            {"image_features": rows, "rows": layout["rows"], "cols": layout["cols"]}
            for rows, layout in zip(split_rows(embeddings, counts), layouts, strict=True)
        ]

    # ---- what the model is fed ---------------------------------------------------------------
    @override
    def hook_inputs(self, model: Model, values: Sequence[ImageValue]) -> dict[str, Any]:
        mx = import_mlx()
        vision = getattr(model.config, "vision_config")  # noqa: B009
        size = int(vision.image_size)
        # One tile of ones: the model needs a non-padding tile to build its patch mask from, and
        # with cached features it encodes none.
        placeholder = mx.ones((1, 1, int(vision.num_channels), size, size), dtype=self.tower_dtype(model))
        return {
            "pixel_values": placeholder,
            "cached_image_features": mx.concatenate([value["image_features"] for value in values]),
        }

    @override
    def feed(self, model: Model, input_ids: Array, hook: Mapping[str, Any]) -> Feed:
        language_model: Any = model.language_model
        embeddings = getattr(model, "_prepare_inputs_for_multimodal")(  # noqa: B009 - the model's merge
            hook["cached_image_features"], language_model.embed_tokens(input_ids), input_ids
        )
        return Feed(input_ids, {"inputs_embeds": embeddings})

    @override
    def forward(self, model: Model, feed: Feed, *, cache: Any = None, mask: Array = None) -> Any:
        # Idefics3.Model.__call__: language_model(inputs=input_ids, mask, cache, inputs_embeds)
        return model.language_model(
            inputs=feed.input_ids, mask=mask, cache=cache, inputs_embeds=feed.inputs_embeds
        )

    @override
    def window(self, feed: Feed, start: int, end: int) -> dict[str, Any]:
        return {"inputs_embeds": feed.inputs_embeds[:, start:end]}


class SmolVLM(Idefics3):
    """SmolVLM / SmolVLM2: Idefics3's model with its own processor (same expansion, renamed)."""

    name = "SmolVLM"
    model_types: ClassVar[frozenset[str]] = frozenset({"smolvlm"})
    processor_classes: ClassVar[frozenset[str]] = frozenset({"SmolVLMProcessor"})
    prompt_module: ClassVar[str] = "mlx_vlm.models.smolvlm.processing_smolvlm"
    global_token: ClassVar[tuple[str, str]] = ("global_image_token", "global_image_token")


def _tokens_per_tile(model: Model) -> int:
    config: Any = model.config
    patches = (int(config.vision_config.image_size) // int(config.vision_config.patch_size)) ** 2
    return patches // int(config.scale_factor) ** 2
