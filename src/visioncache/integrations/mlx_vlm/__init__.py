"""mlx-vlm: drop-ins for ``mlx_vlm.utils.prepare_inputs`` with cached pixel values and vision
features (``pip install 'visioncache[mlx]'``)."""

from visioncache.integrations.mlx_vlm.adapter import (
    SUPPORTED_MODEL_TYPES,
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

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "FeatureEncoder",
    "NamespaceFields",
    "cache_namespace",
    "cached_pixel_entries",
    "image_feature_encoder",
    "inputs_from_features",
    "parse_namespace",
    "prepare_inputs",
    "prepare_inputs_with_features",
]
