"""mlx-vlm: drop-ins for ``mlx_vlm.utils.prepare_inputs`` with cached pixel values and vision
features, one family description per model family (``pip install 'visioncache[mlx]'``), and what
the vllm-mlx integration builds on (the family descriptions are the ``families`` face)."""

from visioncache.integrations.mlx_vlm.adapter import (
    SUPPORTED_MODEL_TYPES,
    FeatureEncoder,
    NamespaceFields,
    cache_namespace,
    cached_pixel_entries,
    encode_entries,
    forward,
    image_feature_encoder,
    inputs_from_features,
    parse_namespace,
    prepare_inputs,
    prepare_inputs_with_features,
)
from visioncache.integrations.mlx_vlm.imports import (
    SUPPORTED_MLX_VLM_VERSION,
    check_mlx_vlm_version,
    import_mlx,
)
from visioncache.integrations.mlx_vlm.protocols import Model, Processor

__all__ = [
    "SUPPORTED_MLX_VLM_VERSION",
    "SUPPORTED_MODEL_TYPES",
    "FeatureEncoder",
    "Model",
    "NamespaceFields",
    "Processor",
    "cache_namespace",
    "cached_pixel_entries",
    "check_mlx_vlm_version",
    "encode_entries",
    "forward",
    "image_feature_encoder",
    "import_mlx",
    "inputs_from_features",
    "parse_namespace",
    "prepare_inputs",
    "prepare_inputs_with_features",
]
