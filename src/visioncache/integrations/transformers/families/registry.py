"""Every family description visioncache supports, by ``config.model_type``; one lookup."""

from __future__ import annotations

from typing import Any

from visioncache.errors import ConfigurationError
from visioncache.integrations.transformers.families.description import Family
from visioncache.integrations.transformers.families.gemma import GEMMA3, GEMMA4
from visioncache.integrations.transformers.families.glm import GLM4V
from visioncache.integrations.transformers.families.idefics import IDEFICS3, SMOLVLM
from visioncache.integrations.transformers.families.internvl import INTERNVL
from visioncache.integrations.transformers.families.llava import LLAVA_ONEVISION
from visioncache.integrations.transformers.families.mistral import MISTRAL3
from visioncache.integrations.transformers.families.qwen import QWEN2_5_VL, QWEN2_VL, QWEN3_5, QWEN3_VL

__all__ = ["FAMILIES", "family_for"]

_DESCRIBED = (
    *(QWEN2_VL, QWEN2_5_VL, QWEN3_VL, QWEN3_5, GLM4V),
    *(GEMMA3, GEMMA4, MISTRAL3, LLAVA_ONEVISION, INTERNVL, IDEFICS3, SMOLVLM),
)
FAMILIES: dict[str, Family] = {family.name: family for family in _DESCRIBED}


def family_for(model: Any) -> Family:
    """The description of ``model``'s family (``config.model_type``); ConfigurationError for a
    family visioncache does not describe or a model without ``get_image_features``."""
    model_type = str(getattr(getattr(model, "config", None), "model_type", None))
    family = FAMILIES.get(model_type)
    if family is None or not hasattr(model, "get_image_features"):
        raise ConfigurationError(
            f"model family {model_type!r} is not supported by visioncache's transformers "
            f"integration; supported: {', '.join(FAMILIES)}"
        )
    return family
