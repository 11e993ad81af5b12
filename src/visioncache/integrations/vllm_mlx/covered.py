"""Images whose KV a prefix hit already holds: not looked up, not encoded.

An image request of turn N+1 usually reuses turn N's KV, which covers every image of the history.
The model reads an image's features only while it prefills that image's tokens, so an image
whose tokens all sit inside the reused prefix needs none. To know that before encoding, the step
needs the prompt's token ids, and those need each image's layout (its token count, its grid):
`ImageLayouts` remembers the layout of every image the engine encoded or found, by digest (the
engine's namespace fixes the processor), and `stand_in` gives a value of that layout with zero
features, which the prompt's feed takes in the image's place.

Exact by construction: the probe (`ImageAwarePrefixCache.covered`) only decides what is encoded
up front. Whatever the engine's own lookup then reuses, a prefill that reads any token of a
stood-in image encodes it first (`PreparedRequest.feed`), so no zero row ever reaches the model.
Only families whose `window` reads an image's value for that image's own positions only take
stand-ins (`Family.layout_fields`, set for Qwen2-VL, Qwen2.5-VL, Qwen3-VL); others encode as
before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from visioncache import forking
from visioncache.integrations.mlx_vlm import import_mlx
from visioncache.integrations.mlx_vlm.families import Family

__all__ = ["ImageLayouts", "Zeros", "covered_images", "layout_of", "stand_in"]

MAX_LAYOUTS = 65_536  # a layout is a few hundred bytes: 65,536 of them are ~20 MB at most


@dataclass(frozen=True)
class Zeros:
    """A feature array's shape and dtype, without its rows."""

    shape: tuple[int, ...]
    dtype: Any


def layout_of(family: Family, value: dict[str, Any]) -> dict[str, Any] | None:
    """What a stand-in for ``value`` needs: its layout fields as they are, every other array as
    `Zeros` (None: the family takes no stand-ins)."""
    if not family.layout_fields:
        return None
    return {
        name: item
        if name in family.layout_fields or not hasattr(item, "shape")
        else Zeros(tuple(item.shape), item.dtype)
        for name, item in value.items()
    }


def stand_in(layout: dict[str, Any]) -> dict[str, Any]:
    """A value of ``layout`` whose feature arrays are zeros (never read: see the module doc)."""
    mx = import_mlx()
    return {
        name: mx.zeros(item.shape, dtype=item.dtype) if isinstance(item, Zeros) else item
        for name, item in layout.items()
    }


class ImageLayouts:
    """Layouts by image digest, least recently used dropped past ``limit`` (any thread)."""

    def __init__(self, limit: int = MAX_LAYOUTS) -> None:
        self._limit = limit
        self._layouts: OrderedDict[bytes, dict[str, Any]] = OrderedDict()
        self._lock = forking.lock()  # a leaf: only the map's own operations run under it

    def remember(self, digest: bytes, layout: dict[str, Any]) -> None:
        with self._lock:
            self._layouts[digest] = layout
            self._layouts.move_to_end(digest)
            while len(self._layouts) > self._limit:
                self._layouts.popitem(last=False)

    def get(self, digest: bytes) -> dict[str, Any] | None:
        with self._lock:
            layout = self._layouts.get(digest)
            if layout is not None:
                self._layouts.move_to_end(digest)
            return layout

    def __len__(self) -> int:
        with self._lock:
            return len(self._layouts)


def covered_images(
    token_ids: Sequence[int], image_token_id: int, counts: Sequence[int], reused: int
) -> list[int]:
    """Indices of the images whose tokens all precede position ``reused - 1``.

    One token less than the probe's reach: an exact hit re-runs the prompt's last token (vllm-mlx
    rewinds it by one), and a stood-in image must never be in what is run.
    """
    positions = [index for index, token in enumerate(token_ids) if token == image_token_id]
    covered, offset = [], 0
    for index, count in enumerate(counts):
        if count and offset + count <= len(positions) and positions[offset + count - 1] < reused - 1:
            covered.append(index)
        offset += count
    return covered
