"""``POST /v1/visioncache/images``: reading an upload's body into image bytes, for any engine.

Bounded before anything is decoded: at most `MAX_IMAGES` images and `MAX_BODY_BYTES` of body, each
image at most the engine's own limit for a downloaded image (``max_image_bytes``). One image as the
raw body (any content type but JSON; ``?encode=false``), or JSON ``{"image": ...}`` /
``{"images": [...]}`` of base64 ``data:`` URLs or raw base64, strictly decoded.
"""

from __future__ import annotations

import json
from typing import Any

import pybase64

from visioncache import VisionCacheError

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_IMAGES",
    "UPLOAD_PATH",
    "UploadError",
    "decode",
    "json_upload",
    "read_upload",
    "too_large",
]

UPLOAD_PATH = "/v1/visioncache/images"
MAX_IMAGES = 16
MAX_BODY_BYTES = 64 * 2**20
_MAX_DATA_URL_HEADER = 256


class UploadError(VisionCacheError):
    """An upload refused; ``status`` and ``code`` are its HTTP answer."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_image") -> None:
        super().__init__(message)
        self.status, self.code = status, code


def too_large(what: str, size: int, limit: int) -> UploadError:
    """A 413 for ``what`` (``"image 0"``, ``"video 1"``, ``"the request body"``) over ``limit``."""
    code = "video_too_large" if what.startswith("video") else "image_too_large"
    return UploadError(f"{what} of {size} bytes exceeds the limit of {limit} bytes", 413, code)


async def read_upload(request: Any, max_image_bytes: int) -> tuple[list[bytes], bool]:
    """The images of an upload request (a Starlette ``Request``) and whether to encode them now.

    Raises:
        UploadError: a body too large, not JSON where JSON is declared, or an image empty, not
            base64 or over ``max_image_bytes``.
    """
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise too_large("the request body", len(body), MAX_BODY_BYTES)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        images, encode = json_upload(bytes(body), max_image_bytes)
    else:
        images, encode = (
            [bytes(body)],
            request.query_params.get("encode", "true").lower() not in {"false", "0"},
        )
    for index, image in enumerate(images):
        if not image:
            raise UploadError(f"image {index} is empty")
        if len(image) > max_image_bytes:
            raise too_large(f"image {index}", len(image), max_image_bytes)
    return images, encode


def json_upload(body: bytes, max_image_bytes: int) -> tuple[list[bytes], bool]:
    """The images of a JSON upload body and its ``encode`` (`UploadError` when malformed)."""
    try:
        document = json.loads(body)
    except ValueError as error:
        raise UploadError(f"the body is not JSON: {error}") from None
    if not isinstance(document, dict) or ("image" in document) == ("images" in document):
        raise UploadError('a JSON upload is {"image": "..."} or {"images": ["...", ...]}')
    texts = [document["image"]] if "image" in document else document["images"]
    encode = document.get("encode", True)
    if not isinstance(texts, list) or not 0 < len(texts) <= MAX_IMAGES:
        raise UploadError(f'"images" must be a list of 1 to {MAX_IMAGES} images')
    if not isinstance(encode, bool):
        raise UploadError('"encode" must be true or false')
    return [decode(text, index, max_image_bytes) for index, text in enumerate(texts)], encode


def decode(text: Any, index: int, limit: int, what: str = "image") -> bytes:
    """A base64 ``data:`` URL or raw base64, strictly decoded; size-checked against ``limit``
    before decoding. ``what`` names the media in errors."""
    if not isinstance(text, str):
        raise UploadError(f"{what} {index} must be a string: a base64 data: URL or raw base64")
    start = 0
    if text.startswith("data:"):
        comma = text.find(",", 0, _MAX_DATA_URL_HEADER)
        if comma < 0 or not text[:comma].lower().endswith(";base64"):
            raise UploadError(
                f"{what} {index}: only base64 data: URLs are accepted (data:{what}/...;base64,...)"
            )
        start = comma + 1
    if (len(text) - start) // 4 * 3 > limit + 2:
        raise too_large(f"{what} {index}", (len(text) - start) // 4 * 3, limit)
    try:
        data: bytes = pybase64.b64decode(text[start:], validate=True)
    except ValueError:  # binascii.Error, or a non-ASCII character
        raise UploadError(f"{what} {index} is not valid base64") from None
    return data
