"""`compute_image_hash` and `compute_images_hash`: the reference module's digest functions."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from visioncache.identity.hasher import ImageHasher
from visioncache.identity.keys import KeyBuilder

__all__ = ["compute_image_hash", "compute_images_hash"]


@functools.cache
def _default_hasher() -> ImageHasher:
    """Built at first use, not at import: importing visioncache has no side effects (and raises
    nothing on an interpreter a hasher refuses, see `visioncache.runtime`)."""
    return ImageHasher()


def compute_image_hash(image_path: Any) -> str:
    """The content digest of one image as 64 hex characters (256-bit blake3, framed by kind).

    Accepts every form in docs/inputs.md: content (bytes, an existing file, a
    ``data:`` URL, raw base64 of media) has one digest in every form (a `ContentDigest` is that
    digest, kept); a PIL image or an array by its pixels; a `ContentId` is the caller's own
    identifier. An http(s) URL is refused: it names content without containing it.
    """
    return _default_hasher().digest(image_path).hex()


def compute_images_hash(images: Sequence[Any]) -> str:
    """An order-sensitive digest of several images; ``"no_images"`` for an empty list."""
    digest = _default_hasher().digest
    digests = [digest(image) for image in images]
    if not digests:
        return "no_images"
    return KeyBuilder().key("images", digests).rsplit("/", 1)[1]
