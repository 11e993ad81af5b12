"""Image identity: a framed, domain-separated blake3 digest of each image's content.

Every accepted input kind hashes under its own domain tag, and every variable-length field is
length-prefixed, so inputs of different kinds, shapes, dtypes or modes cannot share bytes-to-hash
(DESIGN.md principle 1). Encoded image bytes hash the same whether they arrive as a file path, as
bytes or as a ``data:`` URL. An http(s) URL is hashed as a name in its own domain: it does not
contain the image, so a cache keyed by it trusts the server to keep the URL's content unchanged.
"""

from __future__ import annotations

import binascii
import os
import struct
import sys
from typing import Any
from urllib.parse import unquote_to_bytes

import numpy as np
import pybase64
from blake3 import blake3

from visioncache.errors import (
    ImageTooLargeError,
    InvalidImageError,
    UnsupportedImageTypeError,
    describe_input,
)
from visioncache.path_memo import PathDigestMemo
from visioncache.sniff import looks_like_image

__all__ = ["DEFAULT_MAX_IMAGE_BYTES", "DIGEST_SIZE", "ImageHasher", "frame"]

DIGEST_SIZE = 32  # bytes: 256-bit blake3, never truncated
DEFAULT_MAX_IMAGE_BYTES = 256 * 2**20


def _domain_key(domain: str) -> bytes:
    return bytes(blake3(domain.encode()).digest())


# Each input kind hashes in blake3's keyed mode under its own key: domain separation without a
# data prefix, so encoded bytes stay aligned to blake3's 1 KiB chunks and hash at full SIMD speed.
_ENCODED = _domain_key("visioncache/image/encoded-bytes/v1")
_PIL = _domain_key("visioncache/image/pil/v1")
_ARRAY = _domain_key("visioncache/image/ndarray/v1")
_URL = _domain_key("visioncache/image/url/v1")
# base64 is decoded and hashed in slices of this many characters: the slices stay in the CPU
# cache (cheaper than copying a 1.5 MB payload out of its URL first), and each decodes to
# 48 KiB, a whole number of blake3's 1 KiB chunks.
_BASE64_SLICE = 1 << 16
_MAX_DATA_URL_HEADER = 256


def frame(data: bytes) -> bytes:
    """Length-prefix a field so that concatenated fields can be split in only one way."""
    return struct.pack("<Q", len(data)) + data


class ImageHasher:
    """Digests image inputs; one instance per cache (it owns the path memo and the size limit)."""

    def __init__(self, max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES, memo_entries: int = 4096):
        self.max_image_bytes = max_image_bytes
        self.path_memo = PathDigestMemo(memo_entries)

    def digest(self, image: object) -> bytes:
        """The 32-byte digest of one image input; raises a typed error for anything else."""
        if type(image) is bytes:  # the commonest input first: this is the hit path
            return self._digest_encoded(image, image)
        if isinstance(image, str):
            return self._digest_string(image)
        if isinstance(image, bytes | bytearray | memoryview):
            return self._digest_encoded(image, image)
        if isinstance(image, os.PathLike):
            return self._digest_path(os.fsdecode(image), image)
        if isinstance(image, np.ndarray):
            return self._digest_array(image)
        if _is_pil_image(image):
            return self._digest_pil(image)
        raise UnsupportedImageTypeError(
            f"unsupported image input: {describe_input(image)}; expected a file path, a data: URL, "
            "an http(s) URL, bytes, a PIL image or a numpy array"
        )

    def _check_size(self, size: int, original: object) -> None:
        if size > self.max_image_bytes:
            raise ImageTooLargeError(
                f"image input of {size} bytes exceeds max_image_bytes={self.max_image_bytes}: "
                f"{describe_input(original)}"
            )

    def _digest_string(self, text: str) -> bytes:
        if text.startswith("data:"):
            return self._digest_data_url(text)
        scheme = text[:8].lower()
        if scheme.startswith(("http://", "https://")):
            encoded = text.encode("utf-8", "surrogatepass")
            return bytes(blake3(encoded, key=_URL).digest())
        return self._digest_path(text, text)

    def _digest_encoded(self, data: bytes | bytearray | memoryview, original: object) -> bytes:
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > self.max_image_bytes:
            self._check_size(size, original)
        if not looks_like_image(data[:32] if type(data) is bytes else bytes(data[:32])):
            raise InvalidImageError(f"not an image file's bytes: {describe_input(original)}")
        digest: bytes = blake3(data, key=_ENCODED).digest()
        return digest

    def _digest_path(self, path: str, original: object) -> bytes:
        try:
            status = os.stat(path)
        except (OSError, ValueError) as error:
            raise InvalidImageError(
                f"not an existing file, a data: URL or an http(s) URL: {describe_input(original)} "
                f"({type(error).__name__})"
            ) from None
        memoised = self.path_memo.lookup(path, status)
        if memoised is not None:
            return memoised
        self._check_size(status.st_size, original)
        try:
            with open(path, "rb") as file:
                data = file.read()
        except OSError as error:
            raise InvalidImageError(f"cannot read image file {describe_input(original)}: {error}") from None
        digest = self._digest_encoded(data, original)
        self.path_memo.remember(path, status, digest)
        return digest

    def _digest_data_url(self, url: str) -> bytes:
        comma = url.find(",", 5, _MAX_DATA_URL_HEADER)
        if comma < 0:
            raise InvalidImageError(f"malformed data: URL (no ',' after the header): {describe_input(url)}")
        if not url[5:comma].lower().endswith(";base64"):
            return self._digest_encoded(unquote_to_bytes(url[comma + 1 :]), url)
        # 4 base64 characters decode to 3 bytes, so the size is known before decoding.
        start, end = comma + 1, len(url)
        padding = (url[end - 1] == "=") + (url[end - 2] == "=") if end - start >= 2 else 0
        size = (end - start) // 4 * 3 - padding
        self._check_size(size, url)
        if (end - start) % 4 or size <= 0:
            raise InvalidImageError(f"corrupt base64 in data: URL: {describe_input(url)}")
        hasher = blake3(key=_ENCODED)
        try:
            first = pybase64.b64decode(url[start : start + _BASE64_SLICE], validate=True)
            if not looks_like_image(first[:32]):
                raise InvalidImageError(f"data: URL does not hold an image file: {describe_input(url)}")
            hasher.update(first)
            for offset in range(start + _BASE64_SLICE, end, _BASE64_SLICE):
                hasher.update(pybase64.b64decode(url[offset : offset + _BASE64_SLICE], validate=True))
        except binascii.Error as error:
            raise InvalidImageError(f"corrupt base64 in data: URL: {describe_input(url)} ({error})") from None
        digest: bytes = hasher.digest()
        return digest

    def _digest_array(self, array: np.ndarray[Any, Any]) -> bytes:
        if array.dtype.hasobject or array.size == 0:
            raise InvalidImageError(
                f"array image must be non-empty and numeric, got {array.dtype} {array.shape}"
            )
        self._check_size(array.nbytes, array)
        header = frame(array.dtype.str.encode()) + struct.pack(f"<Q{array.ndim}Q", array.ndim, *array.shape)
        hasher = blake3(header, key=_ARRAY)
        hasher.update(np.ascontiguousarray(array).view(np.uint8).reshape(-1).data)
        digest: bytes = hasher.digest()
        return digest

    def _digest_pil(self, image: Any) -> bytes:
        width, height = image.size
        if width == 0 or height == 0:
            raise InvalidImageError(f"empty PIL image of size {image.size}")
        self._check_size(width * height * len(image.getbands()), image)
        palette = image.getpalette() if image.mode in ("P", "PA") else None
        # Transparency changes what convert("RGB"/"RGBA") produces, so it is part of the identity.
        transparency = repr(image.info.get("transparency")).encode()
        header = (
            frame(image.mode.encode())
            + struct.pack("<QQ", width, height)
            + frame(bytes(palette) if palette is not None else b"")
            + frame(transparency)
        )
        hasher = blake3(header, key=_PIL)
        hasher.update(image.tobytes())
        digest: bytes = hasher.digest()
        return digest


def _is_pil_image(value: object) -> bool:
    # A caller holding a PIL image has imported PIL already; checking sys.modules avoids
    # importing PIL for callers that never use it.
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(value, pil.Image)
