"""A request image as visioncache hashes and encodes it: its content, read exactly as stock vllm-mlx
reads it, so that what is cached never changes an answer.

- A ``data:image/...;base64,`` URL within vllm-mlx's length limit is hashed in place: a hit decodes
  nothing and writes no file. The hasher's strict base64 gives the bytes vllm-mlx's lenient
  decoder gives; a payload that is not strict base64 goes the stock way (below).
- Anything else, an http(s) URL included, goes through vllm-mlx's own ``process_image_input``: a
  URL is downloaded on every request, as stock downloads it (its safety checks, redirects, size
  limits and errors), another ``data:`` URL is decoded as stock decodes it, and the local file it
  wrote is hashed. So no entry is ever keyed by a URL's text: after a URL starts serving other
  content, a 404 or a redirect, the answer is stock's (tests/integrations/vllm_mlx/test_vllm_mlx_media.py).
- A ``visioncache://`` handle is what the request holding it found (`Handles.resolve`): a
  ``ContentDigest``, the same entries as the image inline, or, where its features were gone, its
  kept bytes, read and verified once (a `KeptImage`); nothing is opened, read or hashed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from visioncache import ContentDigest, VisionCacheError, VisionEmbeddingCache
from visioncache.integrations.handles import DigestedImage, Handles, KeptImage, is_handle
from visioncache.integrations.vllm_mlx.compat import checked_module

__all__ = ["materialise", "resolve_images"]

_BASE64_DATA_URL = "data:image/"


def _url_of(image: Any) -> Any:
    """The URL string of an OpenAI-style image part (``{"url": ...}``, nested once), or the image."""
    url = image.get("url", image.get("image_url", "")) if isinstance(image, dict) else image
    return url.get("url", "") if isinstance(url, dict) else url


def _is_base64_data_url(url: Any) -> bool:
    """A ``data:image/`` URL whose header says base64 and that vllm-mlx would accept by length.

    vllm-mlx base64-decodes the text after the first comma whatever the header says; the hasher
    does so only for a ``;base64`` header (a percent-encoded payload it would decode otherwise,
    which vllm-mlx does not). Only this case is hashed in place.
    """
    mllm = checked_module("vllm_mlx.models.mllm")

    if not isinstance(url, str) or not url.startswith(_BASE64_DATA_URL):
        return False
    comma = url.find(",")
    return comma > 0 and url[:comma].lower().endswith(";base64") and len(url) <= mllm.MAX_BASE64_IMAGE_LENGTH


def _stock_input(image: Any) -> str:
    """vllm-mlx's own reading of ``image``: a local file (downloaded or decoded), or its error."""
    mllm = checked_module("vllm_mlx.models.mllm")

    path: str = mllm.process_image_input(image)
    return path


def _resolve_image(cache: VisionEmbeddingCache, handles: Handles | None, image: Any) -> tuple[Any, bytes]:
    url = _url_of(image)
    if handles is not None and is_handle(url):
        item = handles.resolve(url)
        return item, item.digest
    if _is_base64_data_url(url):
        try:
            return url, cache.image_digests([url])[0]
        except VisionCacheError:
            pass  # not strict base64: vllm-mlx decodes it leniently; hash the file it writes
    path = _stock_input(image)
    return path, cache.image_digests([path])[0]


def resolve_images(
    cache: VisionEmbeddingCache, handles: Handles | None, images: Sequence[Any]
) -> tuple[list[Any], list[bytes]]:
    """Each image's input form (what `materialise` reads on a miss) and content digest, in order;
    raises vllm-mlx's error (or visioncache's, a handle's) for a bad image."""
    resolved = [_resolve_image(cache, handles, image) for image in images]
    return [form for form, _ in resolved], [digest for _, digest in resolved]


def materialise(handles: Handles | None, image: Any) -> Any:
    """What the encoder reads for a resolved input, on a miss only: a data URL hashed in place
    becomes vllm-mlx's decoded file, a handle its kept bytes (those its request read, or read now);
    a local file stays as it is."""
    if isinstance(image, KeptImage) and handles is not None:
        handles.stats.handle_images_from_kept_bytes += 1
    if isinstance(image, DigestedImage):
        return image.data
    if isinstance(image, ContentDigest) and handles is not None:
        return handles.encode_source(image)
    return _stock_input(image) if _is_base64_data_url(image) else image
