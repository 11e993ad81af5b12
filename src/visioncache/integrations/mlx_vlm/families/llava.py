"""LLaVA and Mistral 3 on mlx-vlm: a CLIP or Pixtral tower, a projector, features scattered into
the image tokens by the model's own merge (`ScatteredFeatures`).

- **LLaVA, one image**: the CLIP image processor resizes and centre-crops it to the tower's input
  (336 px in llava-1.5); its placeholder ``<image>`` becomes one image token per patch (plus the
  processor's ``num_additional_image_tokens``, minus the class token where the strategy is
  ``default``: 576 at 336 px). The tower encodes a batch of images, each on its own; the features
  are the ``vision_feature_layer``'s hidden states (class token dropped), projected.
- **LLaVA's own uncached path**: mlx-vlm 0.7.10's ``prepare_inputs`` fails for LLaVA under
  transformers 5 (it passes ``padding=`` to the image processor), so the self-check's reference
  inputs are mlx-vlm's ``LlavaProcessor`` called as its signature takes them (images and text).
- **Mistral 3, one image**: the Pixtral image processor resizes it (aspect ratio kept, at most
  the tower's size on its longest edge) to multiples of ``patch_size * spatial_merge_size``; its
  placeholder ``[IMG]`` becomes one ``[IMG]`` per merged patch, ``[IMG_BREAK]`` between rows and
  ``[IMG_END]`` last. The tower encodes the images of one call as one sequence with a
  block-diagonal mask (each image attends itself), the projector merges 2 x 2 patches per image.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from typing_extensions import override

from visioncache import PixelOnlyCacheEntry
from visioncache.integrations.mlx_vlm.families.base import ImageValue, split_rows
from visioncache.integrations.mlx_vlm.families.images import load_images
from visioncache.integrations.mlx_vlm.families.scattered import ScatteredFeatures, pixel_entries, size_layout
from visioncache.integrations.mlx_vlm.imports import import_mlx
from visioncache.integrations.mlx_vlm.protocols import Model, Processor

__all__ = ["LLaVA", "Mistral3"]


def _size(layout: Mapping[str, Any]) -> tuple[int, int]:
    return int(layout["height"]), int(layout["width"])


class LLaVA(ScatteredFeatures):
    """LLaVA 1.5 (a CLIP tower, one token per patch)."""

    name = "LLaVA"
    model_types: ClassVar[frozenset[str]] = frozenset({"llava"})
    processor_classes: ClassVar[frozenset[str]] = frozenset({"LlavaProcessor"})

    # ---- one image ---------------------------------------------------------------------------
    @override
    def pixel_layout(self, entry: PixelOnlyCacheEntry) -> Mapping[str, Any]:
        return size_layout(entry)

    @override
    def uncached_inputs(self, processor: Processor, images: Sequence[Any], prompt: str) -> dict[str, Any]:
        loaded = load_images(images, processor.image_processor)
        return dict(processor(images=loaded, text=[prompt]))

    # ---- its placeholder ---------------------------------------------------------------------
    @override
    def image_text(self, processor: Processor, layout: Mapping[str, Any]) -> str:
        # LlavaProcessor: (height // patch) * (width // patch) + additional, minus the class token.
        height, width = _size(layout)
        patch = int(getattr(processor, "patch_size"))  # noqa: B009
        count = (height // patch) * (width // patch) + int(getattr(processor, "num_additional_image_tokens"))  # noqa: B009
        if getattr(processor, "vision_feature_select_strategy", None) == "default":
            count -= 1
        return self.placeholder(processor) * count

    @override
    def token_count(self, model: Model, layout: Mapping[str, Any]) -> int:
        height, width = _size(layout)
        patch = int(getattr(model.config, "vision_config").patch_size)  # noqa: B009
        class_token = 0 if getattr(model.config, "vision_feature_select_strategy", None) == "default" else 1
        return (height // patch) * (width // patch) + class_token

    # ---- misses, batched ---------------------------------------------------------------------
    @override
    def encode(self, model: Model, entries: Sequence[PixelOnlyCacheEntry]) -> list[ImageValue]:
        mx = import_mlx()
        pixels = mx.stack([entry.pixel_values for entry in entries])
        *_, states = self.tower(model)(pixels.transpose(0, 2, 3, 1), output_hidden_states=True)
        config: Any = model.config
        layer, default = config.vision_feature_layer, config.vision_feature_select_strategy == "default"
        if isinstance(layer, int):
            selected = states[layer][:, 1:] if default else states[layer]
        else:
            selected = mx.concatenate([states[i][:, 1:] if default else states[i] for i in layer], axis=-1)
        features = getattr(model, "multi_modal_projector")(selected)  # noqa: B009
        mx.eval(features)
        layouts = [self.pixel_layout(entry) for entry in entries]
        counts = [self.token_count(model, layout) for layout in layouts]
        rows = split_rows(features.reshape(-1, features.shape[-1]), counts)
        return [{"image_features": part, **layout} for part, layout in zip(rows, layouts, strict=True)]


class Mistral3(ScatteredFeatures):
    """Mistral 3 (Mistral Small 3.1 and later; a Pixtral tower, patches merged 2 x 2)."""

    name = "Mistral 3"
    model_types: ClassVar[frozenset[str]] = frozenset({"mistral3"})
    processor_classes: ClassVar[frozenset[str]] = frozenset({"Mistral3Processor"})

    def _unit(self, processor: Processor) -> int:
        """The pixels of one merged patch's side (what image sides are multiples of)."""
        return int(getattr(processor, "patch_size")) * int(getattr(processor, "spatial_merge_size"))  # noqa: B009

    # ---- one image ---------------------------------------------------------------------------
    @override
    def preprocess(self, processor: Processor, images: Sequence[Any]) -> list[PixelOnlyCacheEntry]:
        started = time.perf_counter()
        image_processor = processor.image_processor
        # As Mistral3Processor calls it: one sample, padded to its largest image; each image's
        # pixels are its own corner.
        output = image_processor([load_images(images, image_processor)], patch_size=self._unit(processor))
        padded = np.asarray(output["pixel_values"])
        sizes = [(int(height), int(width)) for height, width in output["image_sizes"]]
        corners = [padded[index, :, :height, :width] for index, (height, width) in enumerate(sizes)]
        return pixel_entries(corners, started)

    @override
    def pixel_layout(self, entry: PixelOnlyCacheEntry) -> Mapping[str, Any]:
        return size_layout(entry)

    @override
    def pixel_inputs(
        self, entries: Sequence[PixelOnlyCacheEntry], images_per_prompt: Sequence[int]
    ) -> dict[str, Any]:
        mx = import_mlx()
        sizes = [_size(self.pixel_layout(entry)) for entry in entries]
        return {
            "pixel_values": _padded([entry.pixel_values for entry in entries], sizes),
            "image_sizes": mx.array(sizes),
        }

    # ---- its placeholder ---------------------------------------------------------------------
    @override
    def image_text(self, processor: Processor, layout: Mapping[str, Any]) -> str:
        height, width = _size(layout)
        unit = self._unit(processor)
        image, row_break, end = (
            getattr(processor, name) for name in ("image_token", "image_break_token", "image_end_token")
        )
        text: str = row_break.join([image * (width // unit)] * (height // unit)) + end
        return text

    @override
    def token_count(self, model: Model, layout: Mapping[str, Any]) -> int:
        height, width = _size(layout)
        config: Any = model.config
        unit = int(config.vision_config.patch_size) * int(config.spatial_merge_size)
        return (height // unit) * (width // unit)

    # ---- misses, batched ---------------------------------------------------------------------
    @override
    def encode(self, model: Model, entries: Sequence[PixelOnlyCacheEntry]) -> list[ImageValue]:
        mx = import_mlx()
        layouts = [self.pixel_layout(entry) for entry in entries]
        sizes = [_size(layout) for layout in layouts]
        pixels = _padded([entry.pixel_values for entry in entries], sizes)
        tower = self.tower(model)
        _, states = tower(pixels.transpose(0, 2, 3, 1), output_hidden_states=True, image_sizes=sizes)
        selected = states[getattr(model.config, "vision_feature_layer")]  # noqa: B009
        if selected.ndim == 3 and selected.shape[0] == 1:
            selected = selected.squeeze(0)
        features = getattr(model, "multi_modal_projector")(selected, sizes)  # noqa: B009
        mx.eval(features)
        counts = [self.token_count(model, layout) for layout in layouts]
        return [
            {"image_features": part, **layout}
            for part, layout in zip(split_rows(features, counts), layouts, strict=True)
        ]


def _padded(pixels: Sequence[Any], sizes: Sequence[tuple[int, int]]) -> Any:
    """``(N, C, H, W)``: each image's pixels in its top-left corner, zeros around them (the
    tower reads each image's own ``image_sizes`` corner only)."""
    mx = import_mlx()
    height, width = max(size[0] for size in sizes), max(size[1] for size in sizes)
    padded = [
        mx.pad(array, ((0, 0), (0, height - h), (0, width - w)))
        for array, (h, w) in zip(pixels, sizes, strict=True)
    ]
    return mx.stack(padded)
