"""Video handles: ``POST /v1/visioncache/videos``, and ``visioncache://`` handles in ``video_url`` parts.

Why this shape: vllm-mlx 0.6.0 serves a request's video on its own path, which serve-mlx leaves
alone (docs/vllm-mlx.md, "Video"): it decodes a ``data:video/...;base64,`` URL to a file, samples
frames with OpenCV and hands them to mlx-vlm as images; it caches no video features. So a video
handle is resolved where that path starts: the handle check (`handle_api.HandleMiddleware`) opens
it under the caller's tenant (a video's handle seals the kind: `handle_codec`), reads the kept bytes
(memory, then the tiers, verified against the handle's digest: `Handles.kept_bytes`) and writes them
into the request body as the data URL the client would have sent inline. A video handle is answered
exactly as the same video inline, by construction, and costs the engine what the inline video
costs (its frames sampled and encoded on every request, as stock does); what it saves is the
client's request bytes.

Uploads are read as images' are (`uploads`: a raw body or JSON, base64 strictly decoded, bounded
before decoding), each video at most what vllm-mlx takes inline (``MAX_VIDEO_SIZE`` and its base64
limit, within the body limit), and must load as vllm-mlx loads a video (OpenCV opens it and gives
at least one sampled frame): a handle is never issued for bytes the engine cannot read, and every
bad upload is a 4xx with a JSON error body. Each video is hashed once; its bytes are kept as an
image's are (same budget, tiers and kept/not-kept answer).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pybase64

from visioncache import ContentDigest
from visioncache.integrations.handles import (
    HANDLE_PREFIX,
    MAX_BODY_BYTES,
    MAX_IMAGES,
    HandleExpiredError,
    Handles,
    UploadError,
    decode,
    is_handle,
    too_large,
)
from visioncache.integrations.vllm_mlx.compat import checked_module
from visioncache.integrations.vllm_mlx.host import ServerHost, tenant_handles
from visioncache.integrations.vllm_mlx.uploads import _digested

__all__ = ["VIDEO_UPLOAD_PATH", "forget_video", "inline_videos", "read_video_upload", "upload_videos"]

VIDEO_UPLOAD_PATH = "/v1/visioncache/videos"
_VIDEO_KEYS = frozenset({"video_url", "video"})
_DATA_URL_HEADER = len("data:video/webm;base64,")
_INVALID = "invalid_video"


def _max_video_bytes() -> int:
    """vllm-mlx's limits on a video it takes inline (its size, its base64 text), within the body's."""
    mllm = checked_module("vllm_mlx.models.mllm")

    as_base64 = (int(mllm.MAX_BASE64_VIDEO_LENGTH) - _DATA_URL_HEADER) // 4 * 3
    return min(int(mllm.MAX_VIDEO_SIZE), as_base64, MAX_BODY_BYTES)


async def read_video_upload(request: Any) -> list[bytes]:
    """The videos of an upload request: the raw body, or JSON ``{"video": ...}`` /
    ``{"videos": [...]}`` of base64 data URLs or raw base64. Raises `UploadError` (4xx)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise too_large("the request body", len(body), MAX_BODY_BYTES)
    limit = _max_video_bytes()
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    videos = _json_upload(bytes(body), limit) if content_type == "application/json" else [bytes(body)]
    for index, video in enumerate(videos):
        if not video:
            raise UploadError(f"video {index} is empty", code=_INVALID)
        if len(video) > limit:
            raise too_large(f"video {index}", len(video), limit)
    return videos


def _json_upload(body: bytes, limit: int) -> list[bytes]:
    try:
        document = json.loads(body)
    except ValueError as error:
        raise UploadError(f"the body is not JSON: {error}", code=_INVALID) from None
    if not isinstance(document, dict) or ("video" in document) == ("videos" in document):
        raise UploadError('a JSON upload is {"video": "..."} or {"videos": ["...", ...]}', code=_INVALID)
    texts = [document["video"]] if "video" in document else document["videos"]
    if not isinstance(texts, list) or not 0 < len(texts) <= MAX_IMAGES:
        raise UploadError(f'"videos" must be a list of 1 to {MAX_IMAGES} videos', code=_INVALID)
    try:
        return [decode(text, index, limit, "video") for index, text in enumerate(texts)]
    except UploadError as error:
        if error.status == 400:
            error.code = _INVALID
        raise


def _container(data: bytes) -> str:
    """The data URL subtype for a video's bytes (vllm-mlx names its temporary file after it)."""
    if data[4:8] == b"ftyp":
        return "quicktime" if data[8:10] == b"qt" else "mp4"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "avi"
    return "mp4"


def _check_loads(videos: list[bytes]) -> None:
    """Each video gives at least one frame as vllm-mlx samples a request's video (OpenCV)."""
    mllm = checked_module("vllm_mlx.models.mllm")

    for index, video in enumerate(videos):
        fd, path = tempfile.mkstemp(suffix="." + _container(video))
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(video)
            try:
                frames = mllm.extract_video_frames_smart(
                    path, fps=mllm.DEFAULT_FPS, max_frames=mllm.MAX_FRAMES
                )
            except ImportError:
                raise  # OpenCV missing: the server's configuration, not the upload
            except Exception as error:  # the bytes' own error: OpenCV raises ValueError, cv2.error, ...
                raise UploadError(
                    f"video {index} is not a video the engine can read: {error}", code=_INVALID
                ) from None
            if not frames:
                raise UploadError(
                    f"video {index} is not a video the engine can read: no frame decodes", code=_INVALID
                )
        finally:
            os.unlink(path)


def upload_videos(installation: ServerHost, videos: list[bytes]) -> dict[str, Any]:
    """Issue video handles for ``videos`` under the caller's tenant: checked as the engine reads
    them, hashed once, kept. Raises `UploadError` (4xx) before anything is kept."""
    handles: Handles = tenant_handles(installation, installation.request_tenant())
    _check_loads(videos)
    digested = _digested(handles, videos)
    return {
        "object": "list",
        "data": [
            {
                "object": "visioncache.video",
                "handle": issued.handle,
                "bytes": len(video),
                "encoded": False,  # vllm-mlx encodes a video's frames on each request
                "kept": issued.kept,
                **({} if issued.reason is None else {"reason": issued.reason}),
            }
            for issued, video in zip(handles.keep(digested, "video"), videos, strict=True)
        ],
    }


def video_data_url(handles: Handles, handle: str) -> str:
    """The data URL of the video ``handle`` names (its kept bytes, verified); raises the handle's
    `HandleError` (malformed, unknown, another kind's, or expired)."""
    digest = handles.digest(handle, "video")
    data = handles.kept_bytes(digest)
    if data is None:
        handles.stats.handles_missing += 1
        raise HandleExpiredError(
            "video handle expired: this server no longer holds the video's bytes; send the video "
            "again (inline, or POST /v1/visioncache/videos for a new handle)"
        )
    handles.stats.handles_resolved += 1
    return f"data:video/{_container(data)};base64," + pybase64.b64encode(data).decode("ascii")


def inline_videos(body: bytes, handles: Handles) -> bytes:
    """``body`` (a JSON request) with every handle where a video goes replaced by the video's data
    URL; each distinct handle opened and read once. Raises the first handle's `HandleError`."""
    urls: dict[str, str] = {}

    def resolve(url: str) -> str:
        if url not in urls:
            urls[url] = video_data_url(handles, url)
        return urls[url]

    document = _replace(json.loads(body), False, resolve)
    return json.dumps(document, ensure_ascii=False).encode("utf-8")


def _replace(node: Any, video_slot: bool, resolve: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: _replace(value, key in _VIDEO_KEYS or (video_slot and key == "url"), resolve)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_replace(value, video_slot, resolve) for value in node]
    return resolve(node) if video_slot and is_handle(node) else node


def forget_video(installation: ServerHost, handle: str) -> dict[str, Any]:
    """``DELETE /v1/visioncache/videos/{handle}``: the caller's tenant forgets the video's kept
    bytes (no features or KV are kept for a video); raises the handle's `HandleError`."""
    handles = tenant_handles(installation, installation.request_tenant())
    if not handle.startswith(HANDLE_PREFIX):
        handle = HANDLE_PREFIX + handle  # the path may carry the token alone
    digest = handles.digest(handle, "video")
    kept = handles.kept.discard_images([ContentDigest(digest)])
    return {"object": "visioncache.video.deleted", "handle": handle, "deleted": True, "kept_bytes": kept}
