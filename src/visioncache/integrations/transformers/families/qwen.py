"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5: a grid-sized run of ``<|image_pad|>`` per image.

The image processor turns an image into ``grid_t * grid_h * grid_w`` patch rows plus its
``image_grid_thw`` row; the placeholder expands to one pad token per merged 2x2 patch group. The
tower takes every image's rows concatenated with their grids and attends within each image
(``cu_seqlens``), so a batch of images encodes as each alone. The forward still needs the grids
(M-RoPE positions). Qwen3-VL's tower also returns deepstack features, one per deepstack layer,
which the forward adds to the image tokens' hidden states: they are cached with the embeddings.
The towers attend within a temporal patch, so video is cached per patch (``video.py``).
"""

from __future__ import annotations

from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

from visioncache.integrations.transformers.families.description import VideoDescription, grid_family

__all__ = ["QWEN2_5_VL", "QWEN2_VL", "QWEN3_5", "QWEN3_VL"]


QWEN2_VL = grid_family("qwen2_vl", video=VideoDescription())
QWEN2_5_VL = grid_family("qwen2_5_vl", video=VideoDescription(seconds_per_grid_input=True))
QWEN3_VL = grid_family(
    "qwen3_vl",
    output_class=BaseModelOutputWithDeepstackFeatures,
    deepstack=True,
    video=VideoDescription(timestamps_in_prompt=True),
)
QWEN3_5 = grid_family("qwen3_5")
