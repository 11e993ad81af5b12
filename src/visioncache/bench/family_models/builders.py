"""One entry point for every family's offline model: ``build_family_model(name)``."""

from __future__ import annotations

import importlib

import torch

from visioncache.bench.family_models.spec import FamilyModel
from visioncache.errors import ConfigurationError

__all__ = ["FAMILY_MODELS", "build_family_model"]

# name -> (module of bench.family_models, its builder(vision, dtype, seed)); imported on use, so
# a family whose transformers classes cannot be imported here fails alone.
_BUILDERS: dict[str, tuple[str, str]] = {
    "qwen2_vl": ("qwen", "qwen2_vl"),
    "qwen2_5_vl": ("qwen", "qwen2_5_vl"),
    "qwen3_vl": ("qwen", "qwen3_vl"),
    "qwen3_5": ("qwen", "qwen3_5"),
    "glm4v": ("patch_towers", "glm4v"),
    "gemma3": ("gemma", "gemma3"),
    "gemma4": ("gemma", "gemma4"),
    "mistral3": ("patch_towers", "mistral3"),
    "llava_onevision": ("tiles", "llava_onevision"),
    "internvl": ("tiles", "internvl"),
    "idefics3": ("tiles", "idefics3"),
    "smolvlm": ("tiles", "smolvlm"),
}
FAMILY_MODELS = tuple(_BUILDERS)


def build_family_model(
    family: str, vision: str = "tiny", dtype: torch.dtype = torch.float32, seed: int = 0
) -> FamilyModel:
    """A random-weight ``family`` model and its offline processor; ConfigurationError for an
    unknown family or a tower size the family has no configuration for."""
    if family not in _BUILDERS:
        raise ConfigurationError(f"unknown model family {family!r}; choose one of {', '.join(FAMILY_MODELS)}")
    module, builder = _BUILDERS[family]
    build = getattr(importlib.import_module(f"visioncache.bench.family_models.{module}"), builder)
    built: FamilyModel = build(vision, dtype, seed)
    return built
