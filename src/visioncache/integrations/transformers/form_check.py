"""The load-time check's call forms: every way of passing a two-image request to the processor.

Why: the processor reads the shape of its ``images=`` argument (LLaVA-OneVision prepares a flat
list's images as each alone, an inner list's as one multi-image group), and `CachedVisionModel`
mirrors it through ``call_forms.lay_out``. A layout that differs from the processor's gives another
prompt and other logits with the same arguments, so each form is proven on the loaded model: the
probe images as a flat list and as one list in a two-image prompt, and over a batch of two
one-image prompts as one list each and as a flat list. Where the processor takes a form, the
inputs built through ``lay_out`` and the description must give its input ids and transformers'
logits; where it refuses one (Gemma 3 wants one list per prompt), ``lay_out`` must refuse it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from PIL import Image

from visioncache.errors import ConfigurationError, VisionCacheError
from visioncache.integrations.transformers import call_forms
from visioncache.integrations.transformers.encoding import FamilyEncoder

__all__ = ["FORMS", "check_call_forms"]

# (name, images per prompt, the images= argument of the two probe images)
FORMS: tuple[tuple[str, int, Callable[[Any, Any], Any]], ...] = (
    ("a flat list in one prompt", 2, lambda a, b: [a, b]),
    ("one list for the prompt", 2, lambda a, b: [[a, b]]),
    ("a batch of prompts, one list each", 1, lambda a, b: [[a], [b]]),
    ("a batch of prompts, a flat list", 1, lambda a, b: [a, b]),
)
# (probe image index, variant) -> the image's value in that variant
Values = dict[tuple[int, str | None], dict[str, Any]]


class Probe(Protocol):
    encoder: FamilyEncoder
    processor: Any

    def text(self, images: int) -> str: ...
    def reference_for(self, texts: list[str], images: Any) -> dict[str, Any]: ...
    def logits(self, inputs: dict[str, Any]) -> torch.Tensor: ...
    def differs(self, actual: torch.Tensor, expected: torch.Tensor) -> float | None: ...
    def refuse(self, why: str) -> ConfigurationError: ...


def _value(probe: Probe, images: list[Image.Image], values: Values, placed: call_forms.Placed) -> Any:
    index = next(position for position, image in enumerate(images) if image is placed.image)
    variant = probe.encoder.family.variant_of(placed.group)
    if (index, variant) not in values:
        entry = probe.encoder.preprocess(images[index], variant)
        values[(index, variant)] = probe.encoder.encode([entry], variant)[0]
    return values[(index, variant)]


def check_call_forms(probe: Probe, images: list[Image.Image], values: Values, batched: bool) -> None:
    """Property 4 (``exactness.py``); raises ConfigurationError naming the form that differs.
    Where batching is inexact (``batched`` False), transformers' own logits for two images depend
    on their batch, so only the input ids are compared, as property 3 does."""
    for name, per_prompt, form in FORMS:
        texts = [probe.text(2)] if per_prompt == 2 else [probe.text(1), probe.text(1)]
        argument = form(*images)
        try:
            reference: dict[str, Any] | None = probe.reference_for(texts, argument)
        except (ValueError, TypeError):
            reference = None
        try:
            placed = call_forms.lay_out(probe.processor, texts, argument)
        except VisionCacheError as error:
            if reference is None:
                continue  # refused alike
            raise probe.refuse(f"call form {name}: the processor takes it, visioncache refuses it") from error
        if reference is None:
            raise probe.refuse(f"call form {name}: the processor refuses it, visioncache would serve it")
        chosen = [_value(probe, images, values, image) for prompt in placed for image in prompt]
        inputs = probe.encoder.model_inputs(texts, chosen)
        ours, theirs = inputs["input_ids"], reference["input_ids"]
        if ours.shape != theirs.shape or not torch.equal(ours.to(theirs.device), theirs):
            raise probe.refuse(
                f"call form {name}: the prompt expands to {list(ours.shape)} tokens, the "
                f"processor's to {list(theirs.shape)} (or other ids)"
            )
        if not batched:
            continue
        try:
            logits = probe.logits(dict(inputs))
        except (ValueError, RuntimeError, IndexError) as error:
            raise probe.refuse(f"call form {name}: the model's forward rejects it: {error}") from error
        difference = probe.differs(logits, probe.logits(reference))
        if difference is not None:
            raise probe.refuse(f"call form {name}: logits {difference:.3g} away from transformers' forward")
