"""The processor's call forms: how an ``images=`` argument is laid out over a batch's prompts.

Why: ``processor(text=..., images=...)`` takes a bare image, a flat list of images, or a list of
images per prompt (nested), and a family may read the nesting: LLaVA-OneVision's image processor
prepares each image of a flat list as alone in its prompt (anyres, ``batch_num_images`` 1 each)
and the images of one inner list as a multi-image group (base size); Gemma 3, Gemma 4, SmolVLM and
Idefics3 want one inner list per prompt. So `CachedVisionModel.prepare` takes the processor's own
arguments and lays them out as the processor does, by asking the processor itself: stand-in images
in the caller's structure go through its ``prepare_inputs_layout`` and ``validate_inputs``. Each
image then fills the next placeholder (in order, across the batch, as ``get_text_with_replacements``
consumes them) and keeps the size of the group it came in: the inner list after the processor's
layout, or 1 for an image of a flat list or a bare image (as LLaVA-OneVision counts it). A form
the processor refuses, or one it could only take differently, is refused here, before any cache
state changes. The load-time check (``exactness.py``) proves each form on the loaded model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from visioncache.errors import InvalidArgumentError, PlaceholderMismatchError, UnsupportedImageTypeError

__all__ = ["Placed", "images_of", "lay_out"]


@dataclass(frozen=True)
class Placed:
    """One image of a request as the processor places it."""

    image: Any  # the caller's image input
    group: int  # images in the group it came in (1: a flat list's image, or a bare image)


def images_of(images: Any) -> list[Any]:
    """The caller's images in order; refuses what the processor would read otherwise."""
    if not isinstance(images, list | tuple):
        return [_one_image(images)]
    inner = [isinstance(item, list | tuple) for item in images]
    if any(inner) and not all(inner):
        raise InvalidArgumentError(
            "images mixes images and lists of images: pass a flat list, or one list per prompt"
        )
    if not any(inner):
        return [_one_image(item) for item in images]
    found = []
    for group in images:
        for item in group:
            if isinstance(item, list | tuple):
                raise InvalidArgumentError("images is nested deeper than one list of images per prompt")
            found.append(_one_image(item))
    return found


def _one_image(image: Any) -> Any:
    if isinstance(image, np.ndarray) and image.ndim == 4:
        raise UnsupportedImageTypeError(
            "a 4-dimensional array is a batch of images to the processor: pass a list of images"
        )
    return image


def _stand_ins(images: Any, made: list[Image.Image]) -> Any:
    """``images``' structure with a fresh 1x1 image in place of each image."""
    if isinstance(images, list | tuple):
        return [_stand_ins(item, made) for item in images]
    stand_in = Image.new("RGB", (1, 1))
    made.append(stand_in)
    return stand_in


def _groups(layout: Any, made: list[Image.Image]) -> list[tuple[int, int]]:
    """(stand-in index, its group's size) for each image of the processor's layout, in order."""
    index = {id(stand_in): position for position, stand_in in enumerate(made)}
    if not isinstance(layout, list | tuple):
        return [(index[id(layout)], 1)]
    if layout and all(isinstance(group, list | tuple) for group in layout):
        return [(index[id(image)], len(group)) for group in layout for image in group]
    return [(index[id(image)], 1) for image in layout]


def lay_out(
    processor: Any, texts: Sequence[str], images: Any, ignore: Sequence[str] = ()
) -> list[list[Placed]]:
    """Per prompt, its images as ``processor(text=texts, images=images)`` places them. ``ignore``:
    placeholder tokens left out of the processor's checks (videos, which visioncache checks)."""
    counts = [text.count(processor.image_token) for text in texts]
    given = [] if images is None else images_of(images)
    if sum(counts) != len(given):
        raise PlaceholderMismatchError(
            f"the prompts have {sum(counts)} {processor.image_token} placeholders but "
            f"{len(given)} images were sent with them ({counts} placeholders per prompt)"
        )
    if not given:
        return [[] for _ in texts]
    made: list[Image.Image] = []
    stand_ins = _stand_ins(images, made)
    checked = list(texts)
    for token in ignore:
        checked = [text.replace(token, "") for text in checked]
    try:
        layout, checked, *_ = processor.prepare_inputs_layout(images=stand_ins, text=checked)
        processor.validate_inputs(images=layout, text=checked)
    except (ValueError, TypeError) as error:
        raise PlaceholderMismatchError(f"the processor refuses this form of images: {error}") from error
    placed = _groups(layout, made)
    if sorted(position for position, _ in placed) != list(range(len(given))):
        raise InvalidArgumentError("the processor's layout of these images is not one place per image")
    flat = [Placed(given[position], group) for position, group in placed]
    per_prompt, start = [], 0
    for count in counts:
        per_prompt.append(flat[start : start + count])
        start += count
    return per_prompt
