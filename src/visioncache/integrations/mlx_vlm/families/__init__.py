"""Model families on mlx-vlm: one description per family (see `base`), found by model type or
processor class, checked on the loaded model before use (`selfcheck`)."""

from visioncache.integrations.mlx_vlm.families.base import Family, Feed, ImageValue
from visioncache.integrations.mlx_vlm.families.registry import (
    FAMILIES,
    SUPPORTED_MODEL_TYPES,
    SUPPORTED_PROCESSORS,
    family_for,
    family_for_model,
    family_for_model_type,
    family_for_processor,
)
from visioncache.integrations.mlx_vlm.families.selfcheck import Exactness, check_family

__all__ = [
    "FAMILIES",
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_PROCESSORS",
    "Exactness",
    "Family",
    "Feed",
    "ImageValue",
    "check_family",
    "family_for",
    "family_for_model",
    "family_for_model_type",
    "family_for_processor",
]
