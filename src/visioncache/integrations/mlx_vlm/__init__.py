"""mlx-vlm: drop-ins for ``mlx_vlm.utils.prepare_inputs`` with cached pixel values and vision
features (``pip install 'visioncache[mlx]'``), and the checks and feature helpers the vllm-mlx
integration builds on."""

from visioncache.integrations.mlx_vlm.adapter import (
    FeatureEncoder,
    NamespaceFields,
    cache_namespace,
    cached_pixel_entries,
    image_feature_encoder,
    inputs_from_features,
    parse_namespace,
    prepare_inputs,
    prepare_inputs_with_features,
)
from visioncache.integrations.mlx_vlm.features import (
    SUPPORTED_MODEL_TYPES,
    check_model,
    feature_check,
    placeholder_pixels,
)
from visioncache.integrations.mlx_vlm.processing import check_processor

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "FeatureEncoder",
    "NamespaceFields",
    "cache_namespace",
    "cached_pixel_entries",
    "check_model",
    "check_processor",
    "feature_check",
    "image_feature_encoder",
    "inputs_from_features",
    "parse_namespace",
    "placeholder_pixels",
    "prepare_inputs",
    "prepare_inputs_with_features",
]
