"""Vision features of mlx-vlm Qwen-VL models: one tower call over many images, split per image.

The Qwen2-VL and Qwen2.5-VL towers attend within each image only (block-diagonal attention over
``image_grid_thw``), so running several images in one call gives, row for row, what running each
alone gives; that makes per-image caching exact, and batching the misses of a request (or of a
scheduler step) free. Each image owns ``prod(grid) // spatial_merge_size**2`` rows of the output.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from visioncache import ConfigurationError, PixelOnlyCacheEntry
from visioncache.integrations.fingerprint import fingerprint, stable_json
from visioncache.integrations.mlx_vlm.imports import import_mlx

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "check_model",
    "encode_pixel_entries",
    "feature_check",
    "model_fingerprint",
    "placeholder_pixels",
    "run_vision_tower",
]

# Families whose ``cached_image_features`` hook replaces exactly the vision tower's output (one
# row per merged patch, concatenated over images). Qwen3-VL is not one: its hook drops the
# deepstack features, so a hit would change the logits.
SUPPORTED_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})


def check_model(model: Any) -> None:
    """Raise ConfigurationError unless cached features are known to be exact for ``model``."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigurationError(
            f"mlx-vlm model type {model_type!r} is not supported by visioncache's cached vision "
            f"features; supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
        )


def _tower_dtype(model: Any) -> Any:
    return model.vision_tower.patch_embed.proj.weight.dtype


def model_fingerprint(model: Any) -> str:
    """A digest of the model's configuration and vision-tower dtype (both shape the features)."""
    settings = {"config": dataclasses.asdict(model.config), "vision_dtype": str(_tower_dtype(model))}
    return fingerprint(["mlx-vlm model", stable_json(settings)], hex_chars=32)


def run_vision_tower(model: Any, pixel_values: Any, image_grid_thw: Any) -> Any:
    """The tower's output for these images (rows of all images, in order), evaluated.

    Casts the pixels as the model's own forward does; evaluation happens here so the tower's
    cost is paid (and can be timed) now, not lazily when a later request reads the entry.
    """
    mx = import_mlx()
    pixels = pixel_values.astype(_tower_dtype(model))
    features = model.vision_tower(pixels, image_grid_thw, output_hidden_states=False)
    mx.eval(features)
    return features


def _rows_per_image(grid: Any, merge_size: int) -> int:
    return int(math.prod(grid.reshape(-1).tolist())) // merge_size**2


def encode_pixel_entries(model: Any, entries: Sequence[PixelOnlyCacheEntry]) -> list[dict[str, Any]]:
    """One tower call over all entries; per image ``{"image_features", "image_grid_thw"}``."""
    mx = import_mlx()
    grids = [entry.image_grid_thw for entry in entries]
    features = run_vision_tower(
        model, mx.concatenate([entry.pixel_values for entry in entries]), mx.concatenate(grids)
    )
    if len(entries) == 1:
        per_image = [features]
    else:
        merge_size = int(model.config.vision_config.spatial_merge_size)
        counts = [_rows_per_image(grid, merge_size) for grid in grids]
        boundaries = [sum(counts[: index + 1]) for index in range(len(counts) - 1)]
        # Slices share the batch's buffer; mx.array copies each, so an entry holds (and is
        # charged for) its own rows only, and evicting it frees them.
        per_image = [mx.array(part) for part in mx.split(features, boundaries)]
    return [
        {"image_features": image_features, "image_grid_thw": grid}
        for image_features, grid in zip(per_image, grids, strict=True)
    ]


def feature_check(model: Any) -> Callable[[Any], bool]:
    """A check of a cached value on a hit: this model's hidden size, one row per merged patch."""
    hidden_size = int(model.config.text_config.hidden_size)
    merge_size = int(model.config.vision_config.spatial_merge_size)

    def fits(value: Any) -> bool:
        features, grid = value["image_features"], value["image_grid_thw"]
        return tuple(features.shape) == (_rows_per_image(grid, merge_size), hidden_size)

    return fits


def placeholder_pixels(model: Any) -> Any:
    """Zero rows of pixels to pass with ``cached_image_features``.

    The model's image branch runs (and its M-RoPE state resets) only when ``pixel_values`` is not
    None, but with cached features it reads no pixel, so none need to exist.
    """
    mx = import_mlx()
    vision = model.config.vision_config
    patch_dim = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    return mx.zeros((0, patch_dim), dtype=_tower_dtype(model))
