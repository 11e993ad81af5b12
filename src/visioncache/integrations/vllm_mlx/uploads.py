"""``POST /v1/visioncache/images``: reading an upload of images and issuing their handles.

Bounded before anything is decoded: at most `MAX_IMAGES` images and `MAX_BODY_BYTES` of body, each
image at most vllm-mlx's own limit for a downloaded image (``MAX_IMAGE_SIZE``, 20 MB in 0.6.0).
Each image must load as the engine loads it (mlx-vlm's ``load_image``; or, when it is encoded
ahead of use, encode): a handle is never issued for bytes the model cannot read, and bytes that do
not load are a 400 whatever the decoder raised. Each image is hashed once: its digest keys the
encode and the kept bytes.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pybase64

from visioncache import VisionCacheError
from visioncache.integrations.vllm_mlx.compat import checked_module
from visioncache.integrations.vllm_mlx.handles import DigestedImage, Handles
from visioncache.integrations.vllm_mlx.host import ServerHost, tenant_handles
from visioncache.integrations.vllm_mlx.step import encode_now

__all__ = ["MAX_BODY_BYTES", "MAX_IMAGES", "UPLOAD_PATH", "UploadError", "read_upload", "upload"]

UPLOAD_PATH = "/v1/visioncache/images"
MAX_IMAGES = 16
MAX_BODY_BYTES = 64 * 2**20
_MAX_DATA_URL_HEADER = 256


class UploadError(VisionCacheError):
    """An upload refused; ``status`` and ``code`` are its HTTP answer."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_image") -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _max_image_bytes() -> int:
    mllm = checked_module("vllm_mlx.models.mllm")

    limit: int = mllm.MAX_IMAGE_SIZE
    return limit


def _too_large(what: str, size: int, limit: int) -> UploadError:
    code = "video_too_large" if what.startswith("video") else "image_too_large"
    return UploadError(f"{what} of {size} bytes exceeds the limit of {limit} bytes", 413, code)


async def read_upload(request: Any) -> tuple[list[bytes], bool]:
    """The images of an upload request and whether to encode them now."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _too_large("the request body", len(body), MAX_BODY_BYTES)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        images, encode = _json_upload(bytes(body))
    else:
        images, encode = (
            [bytes(body)],
            request.query_params.get("encode", "true").lower() not in {"false", "0"},
        )
    limit = _max_image_bytes()
    for index, image in enumerate(images):
        if not image:
            raise UploadError(f"image {index} is empty")
        if len(image) > limit:
            raise _too_large(f"image {index}", len(image), limit)
    return images, encode


def _json_upload(body: bytes) -> tuple[list[bytes], bool]:
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
    return [_decode(text, index) for index, text in enumerate(texts)], encode


def _decode(text: Any, index: int, what: str = "image", limit: int | None = None) -> bytes:
    """A base64 ``data:`` URL or raw base64, strictly decoded; size-checked (against ``limit``,
    default vllm-mlx's image limit) before decoding. ``what`` names the media in errors."""
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
    limit = _max_image_bytes() if limit is None else limit
    if (len(text) - start) // 4 * 3 > limit + 2:
        raise _too_large(f"{what} {index}", (len(text) - start) // 4 * 3, limit)
    try:
        data: bytes = pybase64.b64decode(text[start:], validate=True)
    except ValueError:  # binascii.Error, or a non-ASCII character
        raise UploadError(f"{what} {index} is not valid base64") from None
    return data


def _check_loads(images: list[bytes]) -> None:
    from mlx_vlm.utils import load_image

    for index, image in enumerate(images):
        try:
            load_image(io.BytesIO(image))
        except Exception as error:  # the bytes' own error: PIL raises OSError, ValueError, ...
            raise UploadError(f"image {index} is not an image the engine can read: {error}") from None


def _digested(handles: Handles, images: list[bytes]) -> list[DigestedImage]:
    """Each image with its content digest: the one time an upload hashes it."""
    try:
        digests = handles.kept.image_digests(images)
    except VisionCacheError as error:
        raise UploadError(f"the images cannot be kept: {error}") from None
    return [DigestedImage(digest, image) for digest, image in zip(digests, images, strict=True)]


def upload(installation: ServerHost, images: list[bytes], *, encode: bool) -> dict[str, Any]:
    """Issue handles for ``images`` under the caller's tenant (encoding them first when asked and
    the engine has started)."""
    tenant = installation.request_tenant()
    handles: Handles = tenant_handles(installation, tenant)
    digested = _digested(handles, images)
    engines = list(installation.engines.values())
    encoded = encode and len(engines) == 1
    if encoded:
        try:
            encode_now(installation.tenant_state(engines[0], tenant), list(digested))
        except Exception as error:  # the image's own error: it cannot be read or encoded
            raise UploadError(f"the images could not be encoded: {error}") from None
    else:
        _check_loads(images)
    return {
        "object": "list",
        "data": [
            {
                "object": "visioncache.image",
                "handle": issued.handle,
                "bytes": len(image),
                "encoded": encoded,
                "kept": issued.kept,
                **({} if issued.reason is None else {"reason": issued.reason}),
            }
            for issued, image in zip(handles.keep(digested), images, strict=True)
        ],
    }
