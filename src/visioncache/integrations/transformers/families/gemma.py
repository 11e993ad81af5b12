"""Gemma 3 and Gemma 4.

Gemma 3: every image (and each pan-and-scan crop) is resized to the tower's square input; the
placeholder (``<start_of_image>``) expands to ``mm_tokens_per_image`` soft tokens between begin
and end markers, framed by blank lines. The tower encodes each image on its own (SigLIP, no
cross-image attention), so images batch on axis 0 exactly. The forward takes the rows as one
tensor, and the processor's token types as ``token_type_ids`` (image tokens attend to each other
both ways).

Gemma 4: an image becomes a fixed-length sequence of patches (padded, padding positions -1) and
a variable number of soft tokens (``<|image>`` + soft tokens + ``<image|>``); the tower drops
the padding and returns one tensor per image; the forward takes a tuple and the processor's
``mm_token_type_ids``.
"""

from __future__ import annotations

from visioncache.integrations.transformers.families.description import Family

__all__ = ["GEMMA3", "GEMMA4"]

GEMMA3 = Family("gemma3", pooled_as="tensor", text_renames={"mm_token_type_ids": "token_type_ids"})
GEMMA4 = Family(
    "gemma4",
    encoder_inputs=("pixel_values", "image_position_ids"),
    pad_values={"image_position_ids": -1},
)
