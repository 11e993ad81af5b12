"""Which family describes a model or a processor: by mlx-vlm model type and processor class.

A name alone never makes a family supported: the family found here is also checked on the
loaded model (`selfcheck.check_family`) before its cached values are served.
"""

from __future__ import annotations

from visioncache import ConfigurationError
from visioncache.integrations.mlx_vlm.families.base import Family
from visioncache.integrations.mlx_vlm.families.gemma3 import Gemma3
from visioncache.integrations.mlx_vlm.families.gemma4 import Gemma4
from visioncache.integrations.mlx_vlm.families.idefics3 import Idefics3, SmolVLM
from visioncache.integrations.mlx_vlm.families.llava import LLaVA, Mistral3
from visioncache.integrations.mlx_vlm.families.paligemma import PaliGemma
from visioncache.integrations.mlx_vlm.families.qwen import Qwen2VL, Qwen3VL
from visioncache.integrations.mlx_vlm.protocols import Model, Processor

__all__ = [
    "FAMILIES",
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_PROCESSORS",
    "family_for",
    "family_for_model",
    "family_for_model_type",
    "family_for_processor",
]

FAMILIES: tuple[Family, ...] = (
    Qwen2VL(),
    Qwen3VL(),
    Idefics3(),
    SmolVLM(),
    Gemma4(),
    Gemma3(),
    PaliGemma(),
    LLaVA(),
    Mistral3(),
)
SUPPORTED_MODEL_TYPES = frozenset(model_type for family in FAMILIES for model_type in family.model_types)
SUPPORTED_PROCESSORS = frozenset(name for family in FAMILIES for name in family.processor_classes)
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
_BY_PROCESSOR = {name: family for family in FAMILIES for name in family.processor_classes}


def family_for_model_type(model_type: object) -> Family:
    """The family of an mlx-vlm model type; ConfigurationError naming the supported ones."""
    family = _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ConfigurationError(
            f"mlx-vlm model type {model_type!r} is not supported by visioncache's cached vision "
            f"features (no family description); supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
        )
    return family


def family_for_model(model: Model) -> Family:
    """The family of a loaded mlx-vlm model (by ``model.config.model_type``)."""
    return family_for_model_type(getattr(getattr(model, "config", None), "model_type", None))


def family_for_processor(processor: Processor) -> Family:
    """The family of an mlx-vlm processor (by its class name)."""
    name = type(processor).__name__
    family = _BY_PROCESSOR.get(name)
    if family is None:
        raise ConfigurationError(
            f"processor {type(processor).__module__}.{name} is not supported by visioncache's "
            f"mlx-vlm integration; supported: {', '.join(sorted(SUPPORTED_PROCESSORS))}"
        )
    return family


def family_for(model: Model, processor: Processor) -> Family:
    """The family of a model and its processor; ConfigurationError when they disagree."""
    family = family_for_model(model)
    if family_for_processor(processor) is not family:
        raise ConfigurationError(
            f"processor {type(processor).__name__} is not {family.name}'s "
            f"(model type {model.config.model_type!r})"
        )
    return family
