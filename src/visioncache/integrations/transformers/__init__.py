"""Hugging Face transformers: `CachedVisionModel` builds model inputs from cached per-image and
per-temporal-patch vision output (``pip install 'visioncache[hf]'``)."""

from visioncache.errors import PlaceholderMismatchError
from visioncache.extras import requires
from visioncache.integrations.video import VideoFrames, VideoSettings

with requires("hf", "visioncache.integrations.transformers"):  # torch, transformers
    from visioncache.integrations.transformers.versions import (
        UntestedVersionWarning,
        check_transformers_version,
    )

    check_transformers_version()  # before any family code: an unfit release gets the clear message
    from visioncache.integrations.transformers.adapter import CachedVisionModel
    from visioncache.integrations.transformers.exactness import Exactness
    from visioncache.integrations.transformers.families import FAMILIES, Family
    from visioncache.integrations.transformers.model import (
        DEEPSTACK_FAMILIES,
        SUPPORTED_FAMILIES,
        StageTimes,
        model_namespace,
    )
    from visioncache.integrations.transformers.video import VideoOutput

__all__ = [
    "DEEPSTACK_FAMILIES",
    "FAMILIES",
    "SUPPORTED_FAMILIES",
    "CachedVisionModel",
    "Exactness",
    "Family",
    "PlaceholderMismatchError",
    "StageTimes",
    "UntestedVersionWarning",
    "VideoFrames",
    "VideoOutput",
    "VideoSettings",
    "model_namespace",
]
