"""The uncached reference for family tests, and a counter of vision-tower runs on the model.

The reference is transformers' own path: ``model(**processor(text=..., images=...))``. The
counter hooks the model's vision tower module itself (not visioncache's stats), recording the
pixel tensor of each run, so a test can tell how many times the tower ran and on what.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from PIL import Image

from visioncache.bench.family_models import FamilyModel, build_family_model
from visioncache.bench.tower_clock import vision_tower


def build_or_skip(family: str, **options: Any) -> FamilyModel:
    """``build_family_model``; a skip (not a pass) where this transformers release cannot build
    the family offline because a module it imports needs torchvision (Gemma 4 before 5.21)."""
    try:
        return build_family_model(family, **options)
    except (ImportError, RuntimeError) as error:
        causes = [error, error.__cause__, error.__context__]
        if not any("torchvision" in str(cause) for cause in causes if cause is not None):
            raise
        pytest.skip(f"{family} imports torchvision with this transformers release: untested here")


def prompt(placeholder: str, images: int, question: str = "describe the image") -> str:
    """A one-turn prompt with a word between the image placeholders."""
    parts = " ".join([placeholder] * images)
    return f"user {parts} {question} assistant"


def reference_inputs(
    model: Any, processor: Any, texts: Sequence[str], images: Sequence[Sequence[Any]]
) -> Any:
    """``processor(text=..., images=...)`` with a list of images per prompt (every processor takes
    it; LLaVA-OneVision prepares a prompt's images by their number)."""
    given = [list(request) for request in images] if any(images) else None
    return processor(text=list(texts), images=given, padding=True, return_tensors="pt")


def logits(model: Any, inputs: Any) -> torch.Tensor:
    with torch.no_grad():
        result: torch.Tensor = model(**inputs).logits.float()
    return result


def reference_logits(model: Any, processor: Any, text: str, images: Sequence[Image.Image]) -> torch.Tensor:
    return logits(model, reference_inputs(model, processor, [text], [images]))


@contextmanager
def tower_runs(model: Any) -> Iterator[list[tuple[int, ...]]]:
    """The shape of the pixel tensor of every vision-tower run inside the block."""
    runs: list[tuple[int, ...]] = []

    def record(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        pixels = args[0] if args else kwargs.get("pixel_values", kwargs.get("hidden_states"))
        runs.append(tuple(pixels.shape))

    handle = vision_tower(model).register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield runs
    finally:
        handle.remove()
