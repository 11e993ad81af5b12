"""LLaVA-OneVision: an image is prepared by how it is passed (alone, or in a group).

As an image of a flat list (``images=[a, b]``: ``batch_num_images`` 1 each) or alone, an image is
cut into anyres patches (the grid pinpoint nearest its aspect ratio) plus the base image, and its
placeholder (``<image>``) expands to the unpadded patch features plus one newline token per row;
in an inner list of several images (``images=[[a, b]]``), each image is one base-size patch
padded to a square, and expands to the base features plus one newline (``call_forms.py``).
So an image has two cached variants, ``single`` and ``multi``.
The processor pads a batch's patch stacks to the most patches; the model cuts each image back to
its patch count from its size, and each patch is encoded on its own, so images join on axis 0
exactly. ``batch_num_images`` tells the model which images to patch: 1 per single image; for
``multi`` images one group of at least 2 (the model pairs group entries with images, so a group
larger than the call's images marks every image of the call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from visioncache.integrations.transformers.families.description import Family, process_images

__all__ = ["LLAVA_ONEVISION"]


def _variant(images_in_group: int) -> str:
    return "single" if images_in_group == 1 else "multi"


def _preprocess(
    processor: Any, images: list[Any], variant: str | None, images_kwargs: dict[str, Any]
) -> tuple[Mapping[str, Any], list[str]]:
    """One image as the processor prepares it alone (``single``) or among others (``multi``:
    the image in a two-image prompt with itself, its first copy kept)."""
    if variant == "single":
        return process_images(processor, [images], variant, images_kwargs)
    outputs, replacements = process_images(processor, [images * 2], variant, images_kwargs)
    kept = {name: outputs[name][: len(images)] for name in ("pixel_values", "image_sizes")}
    return kept, replacements[: len(images)]


def _encoder_kwargs(variant: str | None, images: int) -> dict[str, Any]:
    counts = [1] * images if variant == "single" else [max(2, images)]
    return {"batch_num_images": torch.tensor(counts)}


LLAVA_ONEVISION = Family(
    "llava_onevision",
    encoder_inputs=("pixel_values", "image_sizes"),
    variant=_variant,
    preprocess=_preprocess,
    encoder_kwargs=_encoder_kwargs,
)
