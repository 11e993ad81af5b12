"""Hugging Face transformers: `CachedVisionModel` builds model inputs from cached per-image and
per-temporal-patch vision output (``pip install 'visioncache[hf]'``)."""

from visioncache.extras import requires

with requires("hf", "visioncache.integrations.transformers"):  # torch, transformers
    from visioncache.integrations.transformers.adapter import (
        DEEPSTACK_FAMILIES,
        SUPPORTED_FAMILIES,
        CachedVisionModel,
        PlaceholderMismatchError,
        StageTimes,
        VideoFrames,
        VideoOutput,
        VideoSettings,
        model_namespace,
    )

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
