"""The digest of a PIL image: everything that changes what its pixels mean, for every frame.

What the digest covers, mode by mode (each has a collision test in tests/identity/test_pil.py):

- the mode string: ``L``/``P``/``I;16``/``I;16B``/``F``/``LA``/``La``/``PA``/``RGBa``/``CMYK``/``YCbCr``
  … can hold the same raw bytes with different meanings;
- the size, and the raw pixel bytes (``tobytes()``: 1-bit packed for ``1``, 2 bytes a pixel for
  ``I;16*``, 4 for ``I`` and ``F``, one byte a band otherwise);
- for ``P`` and ``PA``: the palette's mode (``RGB`` or ``RGBA``) and its full raw entries, alpha
  included (``getpalette()`` alone drops the alpha: two images differing only there collided);
- ``info["transparency"]``, which changes what ``convert("RGBA")`` produces;
- the EXIF orientation (2 to 8; ``ImageOps.exif_transpose`` reads it, and transformers'
  ``load_image``, mlx-vlm and `visioncache.integrations.transformers.images` transpose by it before
  encoding): an oriented image hashes under its own domain with the orientation, so it never shares
  a key with the same pixels upright. Orientation 1, none, or a value the transpose
  ignores leaves the digest as it was. So two images share a key only if every loader encodes
  them alike; an oriented image and its transposed copy encode alike through ``exif_transpose``
  but get different keys (a loader that ignores EXIF encodes them differently): a miss, never a
  wrong hit. docs/inputs.md states this for every input form;
- for a multi-frame image (animated GIF, WebP or PNG, multi-page TIFF): the frame count, the frame
  it is positioned at (what ``np.asarray`` and image processors read) and every frame, each with
  its own mode, size, palette and transparency. Hashing seeks through the frames and back (under
  a lock, so concurrent lookups of one image cannot move each other's frame), so a hit decodes
  them all: pass the file's path or bytes to make a hit cost one hash of the file.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from blake3 import blake3

from visioncache import forking
from visioncache.errors import InvalidImageError, VisionCacheError, describe_input
from visioncache.identity.framing import domain_key, frame

__all__ = ["pil_digest", "pil_pixel_bytes"]

_PIL = domain_key("visioncache/image/pil/v2")
_PIL_ORIENTED = domain_key("visioncache/image/pil-oriented/v1")  # EXIF orientation 2-8, hashed first
_ORIENTATION_TAG = 0x0112
_TRANSPOSING = range(2, 9)  # the orientations `ImageOps.exif_transpose` acts on
_SEEKING = forking.lock()  # only multi-frame images take it; a fork waits until it is free


def pil_pixel_bytes(mode: str, width: int, height: int) -> int:
    """The length of ``tobytes()`` for one frame of this mode and size, without decoding it."""
    from PIL import ImageMode

    if mode == "1":
        return (width + 7) // 8 * height
    described = ImageMode.getmode(mode)
    return width * height * len(described.bands) * int(described.typestr[2:])


def pil_digest(image: Any, check_size: Callable[[int, object], None]) -> bytes:
    """The 32-byte digest of a PIL image; ``check_size(bytes, image)`` runs before any decoding.

    Every failure to read the image (a truncated or closed file behind a lazily opened image, a
    decoder error) raises `InvalidImageError`.
    """
    width, height = image.size
    if width == 0 or height == 0:
        raise InvalidImageError(f"empty PIL image of size {image.size}")
    try:
        frames = getattr(image, "n_frames", 1)
        if frames == 1:
            return _digest(image, 1, check_size)
        with _SEEKING:  # two threads seeking one image would hash, and leave it at, the wrong frame
            return _digest(image, frames, check_size)
    except VisionCacheError:
        raise
    except Exception as error:  # Pillow's decoders raise OSError, SyntaxError, struct.error, ...
        raise InvalidImageError(
            f"cannot read the pixels of PIL image {describe_input(image)} "
            f"({type(error).__name__}: {error}); a lazily opened image's file may be truncated or closed"
        ) from error


def _digest(image: Any, frames: int, check_size: Callable[[int, object], None]) -> bytes:
    """The digest of ``image`` with ``frames`` frames (multi-frame: under `_SEEKING`)."""
    check_size(pil_pixel_bytes(image.mode, *image.size), image)
    image.load()  # before reading the orientation, as exif_transpose does (a PNG's eXIf chunk)
    hasher = _hasher(frames, _orientation(image))
    if frames == 1:
        _hash_frame(image, hasher)
        return bytes(hasher.digest())
    current = image.tell()
    hasher.update(struct.pack("<Q", current))
    total = 0
    try:
        for index in range(frames):
            image.seek(index)
            total += pil_pixel_bytes(image.mode, *image.size)  # frames may change mode
            check_size(total, image)
            _hash_frame(image, hasher)
    finally:
        image.seek(current)
    return bytes(hasher.digest())


def _orientation(image: Any) -> int:
    """The EXIF orientation ``exif_transpose`` would apply (XMP's included), 1 if none."""
    value = image.getexif().get(_ORIENTATION_TAG, 1)
    return int(value) if value in _TRANSPOSING else 1


def _hasher(frames: int, orientation: int) -> Any:
    if orientation == 1:  # the digest images without a transposing orientation always had
        return blake3(struct.pack("<Q", frames), key=_PIL)
    return blake3(struct.pack("<QQ", orientation, frames), key=_PIL_ORIENTED)


def _hash_frame(image: Any, hasher: Any) -> None:
    image.load()  # a lazily opened image decodes here; its palette is final only after this
    palette = image.palette if image.mode in ("P", "PA") else None
    header = (
        frame(image.mode.encode())
        + struct.pack("<QQ", *image.size)
        + frame(palette.mode.encode() if palette is not None else b"")
        + frame(bytes(image.getpalette(rawmode=None) or ()) if palette is not None else b"")
        + frame(repr(image.info.get("transparency")).encode())
    )
    hasher.update(frame(header))
    pixels = image.tobytes()
    hasher.update(struct.pack("<Q", len(pixels)))
    hasher.update(pixels)
