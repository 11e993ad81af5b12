"""``POST /v1/visioncache/images``: reading an upload of images and issuing their handles.

The body is read by the engine-neutral `handles.upload_body` (bounded before anything is decoded),
each image at most vllm-mlx's own limit for a downloaded image (``MAX_IMAGE_SIZE``, 20 MB in 0.6.0).
Each image must load as the engine loads it (mlx-vlm's ``load_image``; or, when it is encoded
ahead of use, encode): a handle is never issued for bytes the model cannot read, and bytes that do
not load are a 400 whatever the decoder raised. Each image is hashed once: its digest keys the
encode and the kept bytes.
"""

from __future__ import annotations

import io
from typing import Any

from visioncache import VisionCacheError
from visioncache.integrations.handles import (
    MAX_BODY_BYTES,
    MAX_IMAGES,
    UPLOAD_PATH,
    DigestedImage,
    Handles,
    UploadError,
    json_upload,
)
from visioncache.integrations.handles import read_upload as read_upload_body
from visioncache.integrations.vllm_mlx.compat import checked_module
from visioncache.integrations.vllm_mlx.host import ServerHost, tenant_handles
from visioncache.integrations.vllm_mlx.step import encode_now

__all__ = ["MAX_BODY_BYTES", "MAX_IMAGES", "UPLOAD_PATH", "UploadError", "read_upload", "upload"]


def _max_image_bytes() -> int:
    mllm = checked_module("vllm_mlx.models.mllm")

    limit: int = mllm.MAX_IMAGE_SIZE
    return limit


async def read_upload(request: Any) -> tuple[list[bytes], bool]:
    """The images of an upload request and whether to encode them now (`upload_body.read_upload`
    under vllm-mlx's image size limit)."""
    return await read_upload_body(request, _max_image_bytes())


def _json_upload(body: bytes) -> tuple[list[bytes], bool]:
    return json_upload(body, _max_image_bytes())


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
