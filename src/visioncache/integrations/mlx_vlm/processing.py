"""Per-image preprocessing and grid-expanded tokenisation for mlx-vlm's Qwen-VL processors.

mlx-vlm's processors do both in one call (pixels for all images, then each image placeholder
expanded to as many tokens as the image's grid gives), so a cached image would still be decoded
and resized to tokenise a prompt. Here the two are separate: ``preprocess_images`` turns images
into one ``PixelOnlyCacheEntry`` per image (rows and grid as ``mlx.core.array``), and
``tokenize_prompts`` needs only the grids, so a warm request never touches pixels. Both produce
exactly what ``mlx_vlm.utils.prepare_inputs`` produces for the same inputs.
"""

from __future__ import annotations

import io
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from visioncache import ConfigurationError, PixelOnlyCacheEntry, PlaceholderMismatchError
from visioncache.integrations.fingerprint import fingerprint, stable_json
from visioncache.integrations.mlx_vlm.imports import import_mlx, import_mlx_vlm_utils

__all__ = [
    "SUPPORTED_PROCESSORS",
    "check_processor",
    "preprocess_images",
    "processor_fingerprint",
    "tokenize_prompts",
]

# Processors whose image placeholders expand by ``grid.prod() // merge_size**2`` and whose image
# processor returns row-concatenated ``pixel_values`` plus one ``image_grid_thw`` row per image.
SUPPORTED_PROCESSORS = frozenset({"Qwen2VLProcessor", "Qwen2_5_VLProcessor"})


def check_processor(processor: Any) -> None:
    """Raise ConfigurationError unless per-image caching is known to be exact for ``processor``."""
    name = type(processor).__name__
    if name not in SUPPORTED_PROCESSORS:
        raise ConfigurationError(
            f"processor {type(processor).__module__}.{name} is not supported by visioncache's "
            f"mlx-vlm integration; supported: {', '.join(sorted(SUPPORTED_PROCESSORS))}"
        )


def processor_fingerprint(processor: Any) -> str:
    """A digest of everything in ``processor`` that shapes pixel values and placeholder expansion.

    Two processors with the same image-processor settings (sizes, patch and merge sizes,
    normalisation) and image token get the same fingerprint; changing any of them changes it.
    """
    image_processor = processor.image_processor
    settings = {
        "processor": type(processor).__qualname__,
        "image_processor": type(image_processor).__qualname__,
        "image_processor_settings": {
            name: value for name, value in vars(image_processor).items() if not name.startswith("_")
        },
        "image_token": processor.image_token,
    }
    return fingerprint(["mlx-vlm processor", stable_json(settings)], hex_chars=32)


def _load_image(image: Any, image_processor: Any) -> Any:
    """The image as mlx-vlm would hand it to the image processor (RGB PIL image or array)."""
    utils = import_mlx_vlm_utils()
    if isinstance(image, bytes | bytearray | memoryview):
        image = utils.load_image(io.BytesIO(bytes(image)))
    elif isinstance(image, os.PathLike):
        image = os.fspath(image)
    return utils.process_image(image, None, image_processor)


def preprocess_images(processor: Any, images: Sequence[Any]) -> list[PixelOnlyCacheEntry]:
    """Run the image processor once over ``images``; one entry (mlx rows + grid) per image."""
    mx = import_mlx()
    started = time.perf_counter()
    image_processor = processor.image_processor
    output = image_processor(images=[_load_image(image, image_processor) for image in images])
    pixel_values = np.asarray(output["pixel_values"])
    grids = np.asarray(output["image_grid_thw"]).reshape(-1, 3)
    row_ends = np.cumsum(grids.prod(axis=1))
    # mx.array copies each image's rows into its own buffer, so evicting one entry frees its
    # memory and the entry's nbytes is what it really holds.
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


def _expand_placeholders(processor: Any, prompts: list[str], grids: list[Any]) -> list[str]:
    """Replace the n-th image placeholder by ``grid_n.prod() // merge_size**2`` image tokens."""
    token = processor.image_token
    merge_area = int(processor.image_processor.merge_size) ** 2
    counts = [math.prod(grid.reshape(-1).tolist()) // merge_area for grid in grids]
    num_placeholders = sum(prompt.count(token) for prompt in prompts)
    if num_placeholders != len(counts):
        raise PlaceholderMismatchError(
            f"the prompts hold {num_placeholders} image placeholder(s) {token!r} "
            f"but {len(counts)} image(s) were given"
        )
    remaining = iter(counts)
    expanded = []
    for prompt in prompts:
        pieces = prompt.split(token)
        expanded.append(pieces[0] + "".join(token * next(remaining) + piece for piece in pieces[1:]))
    return expanded


def tokenize_prompts(
    processor: Any, prompts: list[str], grids: list[Any], *, add_special_tokens: bool = False
) -> dict[str, Any]:
    """``input_ids`` and ``attention_mask`` (mlx) for ``prompts`` with placeholders expanded.

    Tokenises through the same mlx-vlm call ``prepare_inputs`` uses (left padding, mlx tensors),
    minus the images, so the ids match token for token.
    """
    utils = import_mlx_vlm_utils()
    mx = import_mlx()
    text_inputs = utils.process_inputs_with_fallback(
        processor,
        prompts=_expand_placeholders(processor, prompts, grids),
        images=None,
        audio=None,
        add_special_tokens=add_special_tokens,
    )
    return {
        name: value if isinstance(value, mx.array) else mx.array(value) for name, value in text_inputs.items()
    }
