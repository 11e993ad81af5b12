"""Fingerprints of what shapes cached values: the processor's settings and the model's configuration.

Cached pixel values and placeholder expansions depend on the image processor's settings and the
processor's own (image token, tokens per tile, ...); cached features also on the model's
configuration and the tower's dtype. A cache namespace names both, so a tier shared by several
servers never serves values computed under another configuration.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from visioncache.integrations.fingerprint import fingerprint, stable_json
from visioncache.integrations.mlx_vlm.families import family_for_model
from visioncache.integrations.mlx_vlm.protocols import Model, Processor

__all__ = ["model_fingerprint", "processor_fingerprint"]

_PLAIN = (str, int, float, bool, list, tuple, dict, type(None))
# Processor attributes that change no cached value: the chat template only changes prompts.
_IGNORED = frozenset({"chat_template"})


def _settings(component: Any) -> dict[str, Any]:
    """A component's public plain-valued attributes (its settings; no sub-objects)."""
    return {
        name: value
        for name, value in vars(component).items()
        if not name.startswith("_") and name not in _IGNORED and isinstance(value, _PLAIN)
    }


def processor_fingerprint(processor: Processor) -> str:
    """A digest of everything in ``processor`` that shapes pixel values and placeholder expansion.

    Two processors with the same settings (image-processor sizes, patch and merge sizes,
    normalisation; the processor's image token and tokens per image) get the same fingerprint;
    changing any of them changes it.
    """
    image_processor = processor.image_processor
    settings = {
        "processor": type(processor).__qualname__,
        "processor_settings": _settings(processor),
        "image_processor": type(image_processor).__qualname__,
        "image_processor_settings": _settings(image_processor),
    }
    return fingerprint(["mlx-vlm processor", stable_json(settings)], hex_chars=32)


def model_fingerprint(model: Model) -> str:
    """A digest of the model's configuration and vision-tower dtype (both shape the features)."""
    family = family_for_model(model)
    settings = {
        "config": dataclasses.asdict(model.config),  # type: ignore[call-overload]
        "vision_dtype": str(family.tower_dtype(model)),
    }
    return fingerprint(["mlx-vlm model", stable_json(settings)], hex_chars=32)
