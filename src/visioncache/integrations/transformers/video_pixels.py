"""Video frames to a Qwen vision tower's pixel rows, by the model's own image processor.

Why the image processor: transformers' Qwen video processors need torchvision, which has no CPU
build on this machine kind, while the image processor (PIL backend) does the same per-frame work:
``smart_resize`` within pixel bounds (bicubic), rescale, normalise with the same mean and std, and
the same row layout. It repeats an image over the temporal axis; asked for a temporal patch of 1
it lays each frame out once (half the copying), and a video's temporal patch stacks
``temporal_patch_size`` consecutive frames on that axis, exactly as transformers' video
processor ``patchify`` orders it: rows ``(t, h, w)``-major, each row ``(channel, time, y, x)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from visioncache.integrations.video import VideoSettings, patch_frames

__all__ = ["clip_pixels", "patch_pixels", "preprocess_frames"]


def _size(image_processor: Any, settings: VideoSettings) -> dict[str, Any]:
    """The processor's ``size`` with the video's resolution bounds, as a call keyword."""
    if settings.min_pixels is None and settings.max_pixels is None:
        return {}
    size = dict(image_processor.size)
    if settings.min_pixels is not None:
        size["shortest_edge"] = settings.min_pixels
    if settings.max_pixels is not None:
        size["longest_edge"] = settings.max_pixels
    return {"size": size}


def preprocess_frames(
    image_processor: Any, frames: Sequence[np.ndarray], settings: VideoSettings, temporal: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per frame, its resized, normalised pixels as ``(h * w, channels, patch, patch)`` rows, and
    its ``(1, h, w)`` grid; one image-processor call for all frames, each laid out once."""
    # temporal_patch_size=1: each frame once, not repeated over the temporal axis and cut back
    # (the rows are the same values: normalisation is per pixel, before the patches are laid out).
    output = image_processor(
        images=list(frames), return_tensors="pt", temporal_patch_size=1, **_size(image_processor, settings)
    )
    grids = output["image_grid_thw"]
    patch = image_processor.patch_size
    result = []
    for rows, grid in zip(torch.split(output["pixel_values"], grids.prod(-1).tolist()), grids, strict=True):
        # clone: a view would keep the whole call's output alive in each frame's cache entry.
        result.append((rows.view(len(rows), -1, patch, patch).clone(), grid.clone()))
    return result


def patch_pixels(frames: Sequence[torch.Tensor]) -> torch.Tensor:
    """One temporal patch's rows from its frames' rows, in time order on the temporal axis."""
    stacked = torch.stack([torch.as_tensor(rows) for rows in frames], dim=2)
    return stacked.reshape(len(stacked), -1)


def clip_pixels(
    image_processor: Any, frames: Sequence[np.ndarray], settings: VideoSettings, temporal: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole clip's ``pixel_values_videos`` and ``(t, h, w)`` grid, uncached: the input of the
    model's own video path (the last frame repeats to fill the final temporal patch)."""
    rows = preprocess_frames(image_processor, frames, settings, temporal)
    patches = [
        patch_pixels([rows[at][0] for at in patch_frames(len(rows), first, temporal)])
        for first in range(0, len(rows), temporal)
    ]
    height, width = (int(size) for size in rows[0][1][1:])
    return torch.cat(patches), torch.tensor([len(patches), height, width])
