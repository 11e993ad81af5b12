"""InternVL (transformers' ``internvl``: InternVL3 and 3.5 checkpoints).

An image is cut into up to ``max_patches`` square tiles plus a thumbnail (``crop_to_patches``);
the placeholder (``<IMG_CONTEXT>``) expands to ``<img>``, ``image_seq_length`` context tokens per
tile, ``</img>``. The tower encodes each tile on its own, so tiles of several images batch on
axis 0 exactly; the forward scatters the rows of one tensor.
"""

from __future__ import annotations

from visioncache.integrations.transformers.families.description import Family

__all__ = ["INTERNVL"]

INTERNVL = Family("internvl", pooled_as="tensor")
