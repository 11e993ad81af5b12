"""The vision tower of each mlx-vlm family, and how many images one call of it encodes.

Tests count vision-encoder calls on the model itself (its tower class), the same way in process
and inside the vllm-mlx server harness. For Idefics3 / SmolVLM the unit is an image *tile* (the
tower encodes tiles; an image is its tiles plus a global view).
"""

from __future__ import annotations

import base64
import importlib
import io
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

__all__ = ["TOWER_MODULES", "counted", "tower_class", "tower_units", "towers"]


def _grid_images(pixels: Any, grid_thw: Any = None) -> int:
    return int(grid_thw.shape[0])


def _batch_images(pixels: Any, *_: Any) -> int:
    return len(pixels) if isinstance(pixels, list) else int(pixels.shape[0])


# model type -> (the mlx-vlm module holding its tower class VisionModel, images per call).
TOWER_MODULES: dict[str, tuple[str, Callable[..., int]]] = {
    "qwen2_vl": ("qwen2_vl", _grid_images),
    "qwen2_5_vl": ("qwen2_5_vl", _grid_images),
    "qwen3_vl": ("qwen3_vl", _grid_images),
    "qwen3_5": ("qwen3_vl", _grid_images),  # its tower subclasses Qwen3-VL's
    "idefics3": ("idefics3", _batch_images),
    "smolvlm": ("idefics3", _batch_images),
    "gemma4": ("gemma4", _batch_images),
    "gemma3": ("gemma3", _batch_images),
    "paligemma": ("paligemma", _batch_images),
    "llava": ("llava", _batch_images),
    "mistral3": ("pixtral", _batch_images),  # Mistral 3's tower is Pixtral's
}


def tower_class(model_type: str) -> tuple[type[Any], Callable[..., int]]:
    """The tower class of ``model_type`` and its images-per-call count (from the call's arguments)."""
    module, images = TOWER_MODULES[model_type]
    return importlib.import_module(f"mlx_vlm.models.{module}.vision").VisionModel, images


def towers() -> list[tuple[type[Any], Callable[..., int]]]:
    """Every distinct tower class, once each."""
    found: dict[type[Any], Callable[..., int]] = {}
    for model_type in TOWER_MODULES:
        tower, images = tower_class(model_type)
        found.setdefault(tower, images)
    return list(found.items())


def counted(call: Callable[..., Any], images: Callable[..., int], record: Callable[[int], None]) -> Any:
    """``call`` (a tower's ``__call__``) recording the images of each outermost call: Gemma 4's
    tower encodes a list of images by calling itself once per image, which is still one call."""
    inside = threading.local()

    def counting_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(inside, "depth", 0) == 0:
            record(images(*args[:2]))
        inside.depth = getattr(inside, "depth", 0) + 1
        try:
            return call(self, *args, **kwargs)
        finally:
            inside.depth -= 1

    return counting_call


def tower_units(model_dir: str | Path, images: list[str]) -> int:
    """What encoding ``images`` (data URLs) once each costs the tower of the model in
    ``model_dir``: one per image, or, for Idefics3 / SmolVLM, its tiles (rows x cols + 1)."""
    model_type = json.loads((Path(model_dir) / "config.json").read_text())["model_type"]
    if TOWER_MODULES[model_type][0] != "idefics3":  # only Idefics3's tower encodes tiles
        return len(images)
    from mlx_vlm.utils import load_processor

    processor = load_processor(str(model_dir), add_detokenizer=False)
    decoded = [
        Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB") for url in images
    ]
    output = processor.image_processor([[image] for image in decoded], return_row_col_info=True)
    layouts = zip(output["rows"], output["cols"], strict=True)  # one sample (list) per image
    return sum(rows * cols + 1 if rows else 1 for [rows], [cols] in layouts)
