"""Image handles for any engine's server: ``visioncache://`` names the server seals from an image's
content (`handle_codec`), the kept bytes behind them (`handles`), reading an upload's body
(`upload_body`) and a request's body ahead of the application (`asgi_body`). serve-mlx
(`integrations/vllm_mlx/`) and vLLM's OpenAI server (`integrations/vllm/handle_middleware.py`) serve
them; nothing here imports an engine.
"""

from __future__ import annotations

from visioncache.integrations.handles.asgi_body import is_json_request, read_body, replay_body
from visioncache.integrations.handles.handle_codec import (
    HANDLE_PREFIX,
    HandleCodec,
    HandleError,
    HandleExpiredError,
    MalformedHandleError,
    MediaKind,
    UnknownHandleError,
    WrongKindHandleError,
    is_handle,
)
from visioncache.integrations.handles.handles import (
    BYTES_NAMESPACE,
    DigestedImage,
    Handles,
    HandleStats,
    Issued,
    KeptImage,
)
from visioncache.integrations.handles.upload_body import (
    MAX_BODY_BYTES,
    MAX_IMAGES,
    UPLOAD_PATH,
    UploadError,
    decode,
    json_upload,
    read_upload,
    too_large,
)

__all__ = [
    "BYTES_NAMESPACE",
    "HANDLE_PREFIX",
    "MAX_BODY_BYTES",
    "MAX_IMAGES",
    "UPLOAD_PATH",
    "DigestedImage",
    "HandleCodec",
    "HandleError",
    "HandleExpiredError",
    "HandleStats",
    "Handles",
    "Issued",
    "KeptImage",
    "MalformedHandleError",
    "MediaKind",
    "UnknownHandleError",
    "UploadError",
    "WrongKindHandleError",
    "decode",
    "is_handle",
    "is_json_request",
    "json_upload",
    "read_body",
    "read_upload",
    "replay_body",
    "too_large",
]
