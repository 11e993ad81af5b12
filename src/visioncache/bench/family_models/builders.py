"""One entry point for every family's offline model: ``build_family_model(name)``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from visioncache.bench.family_models import qwen
from visioncache.bench.family_models.spec import FamilyModel
from visioncache.errors import ConfigurationError

__all__ = ["FAMILY_MODELS", "build_family_model"]

# name -> builder(vision, dtype, seed); "full" vision only where the builder knows the tower.
_BUILDERS: dict[str, Callable[[str, torch.dtype, int], FamilyModel]] = {
    "qwen2_vl": lambda vision, dtype, seed: qwen.qwen_vl("qwen2_vl", vision, dtype, seed),
    "qwen2_5_vl": lambda vision, dtype, seed: qwen.qwen_vl("qwen2_5_vl", vision, dtype, seed),
    "qwen3_vl": lambda vision, dtype, seed: qwen.qwen_vl("qwen3_vl", vision, dtype, seed),
    "qwen3_5": qwen.qwen3_5,
}
FAMILY_MODELS = tuple(_BUILDERS)


def build_family_model(
    family: str, vision: str = "tiny", dtype: torch.dtype = torch.float32, seed: int = 0
) -> FamilyModel:
    """A random-weight ``family`` model and its offline processor; ConfigurationError for an
    unknown family or a tower size the family has no configuration for."""
    builder = _BUILDERS.get(family)
    if builder is None:
        raise ConfigurationError(f"unknown model family {family!r}; choose one of {', '.join(FAMILY_MODELS)}")
    return builder(vision, dtype, seed)
