"""Values a correct encoder gives images, and encoders that misbehave: shared by the tests of the
cache, its levels and its store (a value names its image, so a wrong one is seen)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.conftest import encode_image, random_image
from visioncache import (
    PixelOnlyCacheEntry,
    compute_image_hash,
)

IMAGES = [encode_image(random_image(seed)) for seed in range(4)]
A, B, C, D = IMAGES
JOIN_SECONDS = 10.0


def identity(image: bytes) -> int:
    """A number that names the image (24 bits of its digest: exact in float32)."""
    return int(compute_image_hash(image)[:6], 16)


def value_of(image: bytes) -> np.ndarray:
    """The value a correct encoder gives ``image``: it encodes the image's identity."""
    return np.full((2, 4), identity(image), np.float32)


class Encoder:
    """A correct encode_fn that records the images it was asked to encode."""

    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []

    def __call__(self, images: list[bytes]) -> list[np.ndarray]:
        self.calls.append(list(images))
        return [value_of(image) for image in images]


def correct(values: list[Any], images: list[bytes]) -> bool:
    """Whether each value is the one a correct encoder gives its image."""
    return all(np.array_equal(value, value_of(image)) for value, image in zip(values, images, strict=True))


def preprocess(images: list[bytes]) -> list[PixelOnlyCacheEntry]:
    return [PixelOnlyCacheEntry(np.ones((4, 3), np.float32), (1, 2, 2)) for _ in images]


def run_with_timeout(function: Callable[[], Any], seconds: float = JOIN_SECONDS) -> Any:
    """``function()`` on a daemon thread; fails the test (instead of hanging it) if it does not end."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as error:  # handed to the test thread below
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s: a claim was never released"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def sparse_value(_images: list[bytes]) -> list[Any]:
    import torch

    return [torch.zeros(4, 4).to_sparse()]  # its .nbytes raises


class UnsizableArray:
    """An array-like leaf whose ``nbytes`` raises (as torch's sparse tensors do)."""

    @property
    def nbytes(self) -> int:
        raise RuntimeError("nbytes is not defined for this layout")


def owns_its_memory(value: np.ndarray) -> bool:
    """Whether the array keeps alive no more memory than its own bytes."""
    return value.base is None or getattr(value.base, "nbytes", None) == value.nbytes
