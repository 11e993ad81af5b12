"""The load-time check: a family description is proven on the loaded model before it is used.

Why: a name says nothing about a checkpoint's processor settings, a fine-tune's tower, or a
transformers release that changed a family's code. So when `CachedVisionModel` is built, two
small noise images of different sizes go through the description alone, batched, and
transformers' own uncached forward (``model(**processor(text=..., images=...))``):

1. each image alone, through the description: its placeholder expansion must equal the
   processor's (same input ids) and the logits those of the uncached forward: otherwise the
   description is wrong for this model, and it is refused (``ConfigurationError`` naming the
   property);
2. both images in one tower call, split back per image: each part must equal that image encoded
   alone. If it does not, the two-image prompt decides whose fault it is: where transformers'
   own forward equals the prompt built from the images encoded alone, the description's
   batching mixes images, and it is refused; where transformers' own output depends on what an
   image is batched with, the adapter encodes misses one by one (``batched=False``, with the
   reason), so a cached value never depends on its batch;
3. the two-image prompt built from the values in use must equal transformers' forward;
4. each call form of the two images (a flat list, one list for the prompt, a batch of one-image
   prompts as a list each and as a flat list) laid out as ``CachedVisionModel.prepare`` lays it
   out (``call_forms.py``) must give the processor's input ids and transformers' logits for the
   same arguments (the ids alone where batching is inexact), and a form the processor refuses
   must be refused (``form_check.py``).

The result is memoised per model, namespace (config, processor settings, weights) and
description: building many adapters on one model checks it once.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from visioncache.errors import ConfigurationError
from visioncache.integrations.transformers.encoding import FamilyEncoder
from visioncache.integrations.transformers.families import Family
from visioncache.integrations.transformers.form_check import check_call_forms

__all__ = ["Exactness", "check_exactness"]

# Relative bound (of the largest reference logit) by the model's dtype: float32 rounding
# differences between batch shapes are ~1e-7; an image in the wrong place moves logits by ~1e-1.
_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6}
_HALF_TOLERANCE = 5e-2

# model -> (namespace, the description checked, the result): a description is checked by identity.
_MEMO: weakref.WeakKeyDictionary[Any, list[tuple[str, Family, Exactness]]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Exactness:
    """What the load-time check found on the loaded model.

    Attributes:
        family: ``config.model_type``.
        batched: misses are encoded together (True) or one by one (False, see ``reason``).
        reason: why batching is off; empty when it is on.
        max_difference: the largest difference measured on the probes (logits against
            transformers' forward, embeddings batched against alone).
    """

    family: str
    batched: bool
    reason: str
    max_difference: float


def probe_images(sizes: Sequence[tuple[int, int]]) -> list[Image.Image]:
    """Deterministic noise images of the given (height, width): any misplaced row shows."""
    generator = np.random.default_rng(20)
    return [
        Image.fromarray((generator.random((height, width, 3)) * 255).astype(np.uint8))
        for height, width in sizes
    ]


class _Probe:
    """The probe prompts through transformers' path and through the description."""

    def __init__(self, encoder: FamilyEncoder) -> None:
        self.encoder = encoder
        self.model: Any = encoder.model
        self.processor: Any = encoder.processor
        dtype = getattr(self.model, "dtype", torch.float32)
        self.tolerance = _TOLERANCE.get(dtype, _HALF_TOLERANCE)
        self.max_difference = 0.0

    def text(self, images: int) -> str:
        """A prompt with a word around each placeholder (Qwen's M-RoPE groups adjacent images)."""
        return " describe ".join(["describe", *[self.processor.image_token] * images, "image"])

    def reference(self, images: list[Image.Image]) -> dict[str, Any]:
        """transformers' own inputs for one prompt holding ``images``, given as one list for the
        prompt (every processor takes it; LLaVA-OneVision groups the list's images)."""
        return self.reference_for([self.text(len(images))], [images])

    def reference_for(self, texts: list[str], images: Any) -> dict[str, Any]:
        """transformers' own inputs for ``processor(text=texts, images=images)``."""
        inputs = self.processor(text=texts, images=images, padding=True, return_tensors="pt")
        return {
            name: value.to(self.model.device) if isinstance(value, torch.Tensor) else value
            for name, value in dict(inputs).items()
        }

    def logits(self, inputs: dict[str, Any]) -> torch.Tensor:
        with torch.no_grad():
            logits: torch.Tensor = self.model(**inputs).logits
        return logits.float()

    def ours(self, values: list[dict[str, Any]], what: str) -> tuple[dict[str, Any], torch.Tensor]:
        inputs = self.encoder.model_inputs([self.text(len(values))], values)
        try:
            return inputs, self.logits(dict(inputs))
        except (ValueError, RuntimeError, IndexError) as error:
            raise self.refuse(f"the model's forward rejects {what}: {error}") from error

    def differs(self, actual: torch.Tensor, expected: torch.Tensor) -> float | None:
        """The largest difference where it exceeds the tolerance, else None."""
        if actual.shape != expected.shape:
            return float("inf")
        difference = (actual - expected).abs().max().item()
        self.max_difference = max(self.max_difference, difference)
        bound = self.tolerance * max(1.0, expected.abs().max().item())
        return difference if difference > bound else None

    def refuse(self, why: str) -> ConfigurationError:
        return ConfigurationError(
            f"visioncache refuses {type(self.model).__name__} ({self.encoder.family.name}): {why}. "
            "The load-time check compares the family description with transformers' uncached "
            "forward on probe images (docs/families.md)"
        )


def _check_alone(probe: _Probe, images: list[Image.Image]) -> list[dict[str, Any]]:
    """Property 1: each image alone reproduces transformers' forward on it. Returns the values."""
    encoder = probe.encoder
    values = []
    for index, image in enumerate(images):
        variant = encoder.family.variant_of(1)
        value = encoder.encode([encoder.preprocess(image, variant)], variant)[0]
        values.append(value)
        reference = probe.reference([image])
        inputs, logits = probe.ours([value], f"probe image {index} alone")
        ours, theirs = inputs["input_ids"], reference["input_ids"]
        if ours.shape != theirs.shape or not torch.equal(ours.to(theirs.device), theirs):
            raise probe.refuse(
                f"placeholder expansion: probe image {index} expands to {ours.shape[-1]} tokens, "
                f"the processor's to {theirs.shape[-1]} (or other ids)"
            )
        difference = probe.differs(logits, probe.logits(reference))
        if difference is not None:
            raise probe.refuse(
                f"embeddings: probe image {index} encoded alone gives logits {difference:.3g} away "
                "from transformers' forward"
            )
    return values


def _tensors(value: Any) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else list(value)


def _same_values(probe: _Probe, batched: list[dict[str, Any]], alone: list[dict[str, Any]]) -> bool:
    keys = ("embeddings", "deepstack_features") if probe.encoder.family.deepstack else ("embeddings",)
    for joint, apart in zip(batched, alone, strict=True):
        for key in keys:
            pairs = zip(_tensors(joint[key]), _tensors(apart[key]), strict=True)
            if any(probe.differs(a.float(), b.float()) is not None for a, b in pairs):
                return False
    return True


def _check_batch(
    probe: _Probe, images: list[Image.Image], single: list[dict[str, Any]]
) -> tuple[bool, str, list[dict[str, Any]]]:
    """Properties 2 and 3: one tower call for both images, and the two-image prompt.
    ``single``: the images' values encoded alone, reused where an image among others is
    prepared as alone (no variants): the check's tower calls are its cost."""
    encoder = probe.encoder
    variant = encoder.family.variant_of(len(images))
    entries = [encoder.preprocess(image, variant) for image in images]
    if variant == encoder.family.variant_of(1):
        alone = single
    else:
        alone = [encoder.encode([entry], variant)[0] for entry in entries]
    batched = encoder.encode(entries, variant)
    reference = probe.logits(probe.reference(images))
    _, from_alone = probe.ours(alone, "the probe images encoded one by one")
    if _same_values(probe, batched, alone):
        values, batch_exact, reason = batched, True, ""
    else:
        _, from_batch = probe.ours(batched, "the probe images encoded in one call")
        if probe.differs(from_alone, reference) is None and probe.differs(from_batch, reference) is not None:
            raise probe.refuse(
                "batching: two images encoded in one call and split back differ from each "
                "encoded alone, while transformers' own forward does not; the description mixes "
                "images in a batch (wrong split or join)"
            )
        values, batch_exact = alone, False
        reason = (
            "an image's vision output depends on the images batched with it; misses are encoded one by one"
        )
    _, logits = probe.ours(values, "the two-image probe prompt")
    difference = probe.differs(logits, reference)
    if difference is not None and batch_exact:
        raise probe.refuse(
            f"a two-image prompt: logits {difference:.3g} away from transformers' forward, though "
            "each image alone matches"
        )
    return batch_exact, reason, values


def check_exactness(encoder: FamilyEncoder, namespace: str) -> Exactness:
    """Run the check on ``encoder``'s model (once per model and namespace); raises
    ConfigurationError saying which property failed."""
    memo = _MEMO.setdefault(encoder.model, [])
    for checked_namespace, family, result in memo:
        if checked_namespace == namespace and family is encoder.family:
            return result
    probe = _Probe(encoder)
    images = probe_images(encoder.family.probe_sizes)
    was_training = bool(getattr(encoder.model, "training", False))
    encoder.model.eval()
    try:
        single = _check_alone(probe, images)
        batched, reason, together = _check_batch(probe, images, single)
        family = encoder.family
        values = {(index, family.variant_of(1)): value for index, value in enumerate(single)}
        values.update({(index, family.variant_of(2)): value for index, value in enumerate(together)})
        check_call_forms(probe, images, values, batched)
    finally:
        encoder.model.train(was_training)
    result = Exactness(encoder.family.name, batched, reason, probe.max_difference)
    memo.append((namespace, encoder.family, result))
    return result
