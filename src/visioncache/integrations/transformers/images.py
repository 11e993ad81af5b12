"""Decode any visioncache image input into the upright RGB PIL image a transformers processor expects.

Why: visioncache accepts paths, ``data:`` URLs, http(s) URLs, bytes, PIL images and arrays, but an
image processor is called only on cache misses, with whatever inputs missed. transformers'
``load_image`` covers strings and PIL images (EXIF orientation applied, converted to RGB, as the
processor's own path does); this module brings the other kinds to one of those first. Because
the orientation is applied here, a PIL image's EXIF orientation is part of its cache identity
(`visioncache.identity.pil`; docs/inputs.md, "Identity and EXIF orientation").
"""

from __future__ import annotations

import io
import os
from typing import Any, TypeAlias

import numpy as np
from PIL import Image
from transformers.image_utils import load_image

__all__ = ["ImageInput", "load_pil_image"]

ImageInput: TypeAlias = (
    "str | os.PathLike[str] | bytes | bytearray | memoryview | Image.Image | np.ndarray[Any, Any]"
)


def load_pil_image(image: ImageInput) -> Image.Image:
    """One image input as an RGB PIL image with its EXIF orientation applied."""
    if isinstance(image, os.PathLike):
        image = os.fspath(image)
    if isinstance(image, bytes | bytearray | memoryview):
        image = Image.open(io.BytesIO(bytes(image)))
    elif isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    loaded: Image.Image = load_image(image)
    return loaded
