"""GLM-4V (GLM-4.1V, GLM-4.5V's dense tower): Qwen2-VL's layout.

The image processor gives patch rows and an ``image_grid_thw`` row; the placeholder
(``<|image|>``, between ``<|begin_of_image|>`` and ``<|end_of_image|>`` in the chat template)
expands to one token per merged patch group. The tower attends within each image, and the
forward needs the grids (M-RoPE) and the processor's ``mm_token_type_ids``.
"""

from __future__ import annotations

from visioncache.integrations.transformers.families.description import grid_family

__all__ = ["GLM4V"]

GLM4V = grid_family("glm4v")
