"""Mistral 3 (Mistral Small 3.x, Ministral 3) with its Pixtral tower.

An image is resized to patch multiples (longest edge bounded) and keeps its size; the
placeholder (``[IMG]``) expands to rows x columns of ``[IMG]`` (one per merged patch) with an
``[IMG_BREAK]`` after each row and ``[IMG_END]`` last. The processor pads a batch's images to the
largest and passes their true sizes; the tower cuts each image back to its size and attends
within each image (block-diagonal), so images join on axis 0 exactly, padded with zeros.
"""

from __future__ import annotations

from visioncache.integrations.transformers.families.description import Family

__all__ = ["MISTRAL3"]

MISTRAL3 = Family("mistral3", encoder_inputs=("pixel_values", "image_sizes"))
