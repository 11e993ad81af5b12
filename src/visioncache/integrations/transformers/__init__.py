"""Hugging Face transformers: `CachedVisionModel` builds model inputs from cached per-image and
per-temporal-patch vision output (``pip install 'visioncache[hf]'``)."""

from visioncache.errors import PlaceholderMismatchError
from visioncache.extras import requires
from visioncache.integrations.video import VideoFrames, VideoSettings

with requires("hf", "visioncache.integrations.transformers"):  # torch, transformers
    from visioncache.integrations.transformers.adapter import CachedVisionModel
    from visioncache.integrations.transformers.model import (
        DEEPSTACK_FAMILIES,
        SUPPORTED_FAMILIES,
        StageTimes,
        model_namespace,
    )
    from visioncache.integrations.transformers.video import VideoOutput

__all__ = [
    "DEEPSTACK_FAMILIES",
    "SUPPORTED_FAMILIES",
    "CachedVisionModel",
    "PlaceholderMismatchError",
    "StageTimes",
    "VideoFrames",
    "VideoOutput",
    "VideoSettings",
    "model_namespace",
]
