"""Images and the values a correct encoder gives them (a value names its image), for the shared
tiers' tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.conftest import encode_image, random_image
from visioncache import PixelOnlyCacheEntry, compute_image_hash

REPOSITORY = Path(__file__).parents[2]
JOIN_SECONDS = 60.0


def image(seed: int) -> bytes:
    return encode_image(random_image(seed))


def value_of(item: bytes) -> np.ndarray:
    """The value a correct encoder gives ``item``: its digest's bytes (so it names the image)."""
    return np.frombuffer(bytes.fromhex(compute_image_hash(item)), np.uint8).astype(np.float32).reshape(4, 8)


class Encoder:
    def __init__(self) -> None:
        self.encoded = 0

    def __call__(self, images: list[bytes]) -> list[np.ndarray]:
        self.encoded += len(images)
        return [value_of(item) for item in images]


def must_not_encode(images: list[bytes]) -> list[np.ndarray]:
    raise AssertionError(f"encoded {len(images)} images that a shared tier holds")


def preprocess(images: list[bytes]) -> list[PixelOnlyCacheEntry]:
    return [PixelOnlyCacheEntry(value_of(item), (1, 2, 2)) for item in images]


def all_correct(values: list[Any], images: list[bytes]) -> bool:
    return len(values) == len(images) and all(
        value is not None and np.array_equal(value, value_of(item))
        for value, item in zip(values, images, strict=True)
    )
