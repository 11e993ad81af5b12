"""Input identity: a framed, domain-separated blake3 digest of each input's content.

Content is content: an existing regular file, a bytes-like object, a ``data:`` URL, or a string of
strict base64 whose bytes start a known image, video or audio container, is identified by its
bytes, whatever their format, and the same bytes get one digest in every form; a `ContentDigest`
is such a digest, kept. Decoded pixels (a PIL image, a numpy array) hash with their mode or dtype
and shape; a `ContentId` is the caller's own identifier; a video's file index, frames and temporal
patches are `visioncache.identity.video` items over these digests. Each of these kinds hashes in
blake3's keyed mode under its own key, and variable-length fields are framed, so no two kinds,
shapes, dtypes or modes share bytes-to-hash (docs/design.md, principle 1). A string that is none of
these is refused: a mistyped file name must fail loudly, never be hashed as if it were content. So
is an http(s) URL: it names content without containing it, and what it serves can change, so no
key may trust it (fetch it and pass the bytes).

Work is bounded: sizes are checked before reading or decoding, and a file (an image or a video
alike) is read only if it is a regular file, without blocking, streamed in chunks, and to at most
``max_image_bytes + 1`` bytes (`visioncache.identity.files`).
"""

from __future__ import annotations

import os
import sys
from urllib.parse import unquote_to_bytes

import numpy as np
import pybase64
from blake3 import blake3

from visioncache.errors import (
    ImageTooLargeError,
    InvalidImageError,
    UnsupportedImageTypeError,
    describe_input,
    describe_path,
)
from visioncache.identity.arrays import array_digest
from visioncache.identity.base64_view import ascii_tail
from visioncache.identity.content_id import ContentDigest, ContentId
from visioncache.identity.files import hash_file, require_regular_file, stat_or_reason
from visioncache.identity.framing import DIGEST_SIZE, domain_key, frame
from visioncache.identity.path_memo import PathDigestMemo
from visioncache.identity.pil import pil_digest
from visioncache.identity.sniff import SNIFF_BYTES, media_kind
from visioncache.identity.video import VideoFile, VideoFrame, VideoPatch, video_item_digest

__all__ = ["ACCEPTED_INPUTS", "DEFAULT_MAX_IMAGE_BYTES", "DIGEST_SIZE", "ImageHasher", "frame"]

DEFAULT_MAX_IMAGE_BYTES = 256 * 2**20
ACCEPTED_INPUTS = (
    "a path (str or os.PathLike) of an existing regular file, a data: URL, a str of strict base64 "
    "of an image, video or audio file, bytes, bytearray, a contiguous memoryview, a PIL image, "
    "a numpy array, visioncache.ContentDigest(digest) for a digest image_digests returned, "
    "visioncache.ContentId('...') for an identifier you already have, or a visioncache.identity "
    "VideoFile, VideoFrame or VideoPatch"
)

# Keyed mode, one key per input kind: domain separation without a data prefix, so content stays
# aligned to blake3's 1 KiB chunks and hashes at full SIMD speed. The content key keeps its v1 name
# so digests of content stored before media other than images were accepted stay valid.
_CONTENT = domain_key("visioncache/image/encoded-bytes/v1")
_CONTENT_ID = domain_key("visioncache/content-id/v1")
_SNIFF_CHARS = (SNIFF_BYTES + 2) // 3 * 4  # base64 characters holding the first SNIFF_BYTES bytes
_MAX_DATA_URL_HEADER = 256
# The kernel refuses longer names (ENAMETOOLONG), so a longer string cannot name a file and is
# not stat'ed: a 1 MB base64 string would otherwise be copied to a file-system name first.
_MAX_PATH_CHARS = 4096 if os.name == "posix" else 32767


class ImageHasher:
    """Digests inputs; one instance per cache (it owns the path memo and the size limit)."""

    def __init__(self, max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES, memo_entries: int = 4096):
        self.max_image_bytes = max_image_bytes
        self.path_memo = PathDigestMemo(memo_entries)

    def digest(self, image: object) -> bytes:
        """The 32-byte digest of one input; raises a typed error for anything else."""
        if type(image) is bytes:  # the commonest input first: this is the hit path
            return self._digest_content(image, image)
        if isinstance(image, str):
            return self._digest_string(image)
        if isinstance(image, bytes | bytearray):
            return self._digest_content(image, image)
        if isinstance(image, memoryview):
            return self._digest_memoryview(image)
        if isinstance(image, ContentDigest):
            return image.digest
        if isinstance(image, ContentId):
            digest: bytes = blake3(image.value.encode("utf-8", "surrogatepass"), key=_CONTENT_ID).digest()
            return digest
        if isinstance(image, os.PathLike):
            path = os.fsdecode(image)
            return self._digest_file(path, self._stat(path, image), image)
        if isinstance(image, np.ndarray):
            return array_digest(image, self._check_size)
        if _is_pil_image(image):
            return pil_digest(image, self._check_size)
        if isinstance(image, VideoFile | VideoFrame | VideoPatch):
            return video_item_digest(image)
        raise UnsupportedImageTypeError(
            f"unsupported input: {describe_input(image)}; expected {ACCEPTED_INPUTS}"
        )

    def _check_size(self, size: int, original: object) -> None:
        if size > self.max_image_bytes:
            raise ImageTooLargeError(
                f"input of {size} bytes exceeds max_image_bytes={self.max_image_bytes}: "
                f"{describe_input(original)}"
            )

    def _digest_content(self, data: bytes | bytearray | memoryview, original: object) -> bytes:
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > self.max_image_bytes or size == 0:
            self._check_size(size, original)
            raise InvalidImageError(f"empty content: {describe_input(original)}")
        digest: bytes = blake3(data, key=_CONTENT).digest()
        return digest

    def _digest_memoryview(self, view: memoryview) -> bytes:
        try:
            flat = view.ndim > 0 and view.c_contiguous
        except ValueError:  # released
            raise InvalidImageError("a released memoryview has no content") from None
        if not flat:
            raise InvalidImageError(
                f"a memoryview must be C-contiguous and at least 1-dimensional (got ndim={view.ndim}, "
                f"c_contiguous={view.c_contiguous}); pass bytes(view) or a contiguous copy"
            )
        # blake3 reads unsigned bytes: a view of floats, or of several dimensions, is cast (no copy).
        return self._digest_content(view if view.format == "B" and view.ndim == 1 else view.cast("B"), view)

    # ---- strings -------------------------------------------------------------------------------
    def _digest_string(self, text: str) -> bytes:
        if text.startswith("data:"):
            return self._digest_data_url(text)
        if text[:8].lower().startswith(("http://", "https://")):
            raise InvalidImageError(
                f"{describe_input(text)} is an http(s) URL: it names an image without containing it, "
                "and what it serves can change, so visioncache never keys by it. Fetch it and pass "
                "the bytes, or pass ContentId(url) if you guarantee what it serves never changes"
            )
        found = stat_or_reason(text) if len(text) < _MAX_PATH_CHARS else "too long for a file name"
        if type(found) is os.stat_result:
            return self._digest_file(text, found, text)
        return self._digest_raw_base64(text, str(found))

    def _digest_raw_base64(self, text: str, reason: str) -> bytes:
        """Strict base64 whose first bytes start known media is that content; anything else is refused."""
        try:
            kind = media_kind(pybase64.b64decode(text[:_SNIFF_CHARS], validate=True))
        except ValueError:  # binascii.Error, or a non-ASCII character
            kind = None
        if kind is None or len(text) % 4:
            raise InvalidImageError(
                f"{describe_path(text)} is not an existing file ({reason}), a data: URL, "
                f"nor strict base64 of an image, video or audio file. Accepted: {ACCEPTED_INPUTS}"
            )
        return self._digest_base64(text, 0, "base64 string")

    def _digest_data_url(self, url: str) -> bytes:
        comma = url.find(",", 5, _MAX_DATA_URL_HEADER)
        if comma < 0:
            raise InvalidImageError(f"malformed data: URL (no ',' after the header): {describe_input(url)}")
        if url[5:comma].lower().endswith(";base64"):
            return self._digest_base64(url, comma + 1, "data: URL")
        payload = url[comma + 1 :]
        # Every character decodes to at least one byte and "%XX" to one: a lower bound, so an
        # oversize URL is refused before any decoding.
        self._check_size(len(payload) - 2 * payload.count("%"), url)
        return self._digest_content(unquote_to_bytes(payload.encode("utf-8", "surrogatepass")), url)

    def _digest_base64(self, text: str, start: int, what: str) -> bytes:
        # 4 base64 characters decode to 3 bytes, so the size is known before decoding.
        end = len(text)
        padding = (text[end - 1] == "=") + (text[end - 2] == "=") if end - start >= 2 else 0
        size = (end - start) // 4 * 3 - padding
        self._check_size(size, text)
        if (end - start) % 4 or size <= 0:
            problem = "empty content" if end == start else "corrupt base64"
            raise InvalidImageError(f"{problem} in {what}: {describe_input(text)}")
        try:  # one decode of the whole payload, read in place: no copy out of the URL
            content = pybase64.b64decode(ascii_tail(text, start), validate=True)
        except ValueError as error:  # binascii.Error, or a non-ASCII character
            raise InvalidImageError(f"corrupt base64 in {what}: {describe_input(text)} ({error})") from None
        digest: bytes = blake3(content, key=_CONTENT).digest()
        return digest

    # ---- files ---------------------------------------------------------------------------------
    def _stat(self, path: str, original: object) -> os.stat_result:
        found = stat_or_reason(path)
        if type(found) is not os.stat_result:
            raise InvalidImageError(f"not an existing file: {describe_path(original)} ({found})")
        return found

    def _digest_file(self, path: str, status: os.stat_result, original: object) -> bytes:
        require_regular_file(status, original)
        memoised = self.path_memo.lookup(path, status)
        if memoised is not None:
            return memoised
        digest, status = hash_file(path, _CONTENT, self.max_image_bytes, self._check_size, original)
        self.path_memo.remember(path, status, digest)
        return digest


def _is_pil_image(value: object) -> bool:
    # A caller holding a PIL image has imported PIL already; checking sys.modules avoids
    # importing PIL for callers that never use it.
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(value, pil.Image)
