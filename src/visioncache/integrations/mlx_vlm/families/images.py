"""Images as mlx-vlm hands them to an image processor (RGB PIL images or arrays)."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

from visioncache.integrations.mlx_vlm.imports import import_mlx_vlm_utils
from visioncache.integrations.mlx_vlm.protocols import ImageProcessor

__all__ = ["load_images"]


def load_images(images: Sequence[Any], image_processor: ImageProcessor | None) -> list[Any]:
    """Each image (a path, ``os.PathLike``, URL, bytes, PIL image or array) loaded by mlx-vlm's
    own ``load_image`` / ``process_image``, as ``prepare_inputs`` loads it."""
    utils = import_mlx_vlm_utils()
    loaded = []
    for image in images:
        if isinstance(image, bytes | bytearray | memoryview):
            image = utils.load_image(io.BytesIO(bytes(image)))
        elif isinstance(image, os.PathLike):
            image = os.fspath(image)
        loaded.append(utils.process_image(image, None, image_processor))
    return loaded
