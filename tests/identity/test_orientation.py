"""EXIF orientation and identity: two inputs share a key only if every loader encodes
them alike.

The defect: PIL images with the same pixels and EXIF orientation 1 vs 3 got one key, while
transformers' ``load_image``, mlx-vlm's and visioncache's own `load_pil_image` rotate by the
orientation before encoding, so the rotated image was served the upright one's embedding, with the
same token count (``expect=`` could not catch it).

The decision (docs/inputs.md, "Identity and EXIF orientation"): an input's identity is its content
as given, with everything a loader reads to decide what it encodes. Encoded bytes (a file, bytes,
a data: URL) are identified by all their bytes, EXIF included; a PIL image by its pixels, mode,
palette, frames and its EXIF orientation; an array by dtype, shape and bytes (it has no EXIF). So
forms that a loader happens to encode alike (a JPEG and the same decoded as PIL; an oriented image
and its transposed copy) may miss each other's entries, but two inputs that any loader encodes
differently never share one: a miss, never a wrong hit.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps

from tests.conftest import random_image
from visioncache import compute_image_hash

ORIENTATION = 0x0112  # the EXIF tag


def jpeg_with_orientation(orientation: int | None, seed: int = 7) -> bytes:
    """The same JPEG pixels, saved with this EXIF orientation (None: no EXIF at all)."""
    buffer = io.BytesIO()
    image = random_image(seed, (24, 16))
    if orientation is None:
        image.save(buffer, "JPEG", quality=90)
    else:
        exif = Image.Exif()
        exif[ORIENTATION] = orientation
        image.save(buffer, "JPEG", quality=90, exif=exif)
    return buffer.getvalue()


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_regression_exif_orientation_is_not_part_of_a_pil_images_identity() -> None:
    upright, rotated = decoded(jpeg_with_orientation(1)), decoded(jpeg_with_orientation(3))
    assert upright.tobytes() == rotated.tobytes()  # the same pixels: only the orientation differs
    assert compute_image_hash(upright) != compute_image_hash(rotated)
    # ...because a loader encodes them differently:
    assert ImageOps.exif_transpose(rotated).tobytes() != ImageOps.exif_transpose(upright).tobytes()


@pytest.mark.parametrize("orientation", range(2, 9))
def test_every_transposing_orientation_is_its_own_identity(orientation: int) -> None:
    plain = decoded(jpeg_with_orientation(None))
    oriented = decoded(jpeg_with_orientation(orientation))
    others = {
        compute_image_hash(decoded(jpeg_with_orientation(other)))
        for other in range(2, 9)
        if other != orientation
    }
    assert compute_image_hash(oriented) != compute_image_hash(plain)
    assert compute_image_hash(oriented) not in others


@pytest.mark.parametrize("orientation", [None, 1, 0, 9])
def test_orientations_that_transpose_nothing_share_the_plain_identity(orientation: int | None) -> None:
    """No EXIF, orientation 1, or a value ``exif_transpose`` ignores: the image as it is."""
    plain = decoded(jpeg_with_orientation(None))
    assert compute_image_hash(decoded(jpeg_with_orientation(orientation))) == compute_image_hash(plain)


def test_the_pairs_of_input_forms_each_get_their_own_identity() -> None:
    """The JPEG's bytes with an orientation, the same decoded as PIL, and a transposed copy."""
    data = jpeg_with_orientation(3)
    image = decoded(data)
    transposed = ImageOps.exif_transpose(image)
    assert transposed.getexif().get(ORIENTATION, 1) == 1
    digests = {
        "bytes, orientation 3": compute_image_hash(data),
        "bytes, orientation 1": compute_image_hash(jpeg_with_orientation(1)),
        "PIL, orientation 3": compute_image_hash(image),
        "PIL transposed copy": compute_image_hash(transposed),
        "array of the PIL pixels": compute_image_hash(np.asarray(image)),
    }
    assert len(set(digests.values())) == len(digests), digests


def forms() -> dict[str, Any]:
    """Every way to hand over an upright-by-EXIF or plain image."""
    rotated_bytes, upright_bytes = jpeg_with_orientation(3), jpeg_with_orientation(1)
    rotated, upright = decoded(rotated_bytes), decoded(upright_bytes)
    return {
        "bytes o3": rotated_bytes,
        "bytes o1": upright_bytes,
        "bytes o3 again": bytes(rotated_bytes),
        "PIL o3": rotated,
        "PIL o3 again": decoded(rotated_bytes),
        "PIL o1": upright,
        "PIL o3 transposed": ImageOps.exif_transpose(rotated),
        "array o3 pixels": np.asarray(rotated),
        "array o3 transposed": np.asarray(ImageOps.exif_transpose(rotated)),
    }


@pytest.mark.parametrize(
    "loader_name", ["visioncache load_pil_image", "transformers load_image", "no EXIF handling"]
)
def test_inputs_that_share_a_key_are_encoded_alike_by_every_loader(loader_name: str) -> None:
    """For each pair of forms: equal digests imply equal pixels from the loader, whichever loader
    (one that applies EXIF orientation, or one that reads raw pixels)."""
    loaders: dict[str, Callable[[Any], np.ndarray]] = {
        "no EXIF handling": lambda item: np.asarray(
            decoded(item)
            if isinstance(item, bytes)
            else item
            if isinstance(item, np.ndarray)
            else item.convert("RGB")
        ),
    }
    if loader_name != "no EXIF handling":
        pytest.importorskip("transformers")
        from transformers.image_utils import load_image

        from visioncache.integrations.transformers.images import load_pil_image

        loaders["visioncache load_pil_image"] = lambda item: np.asarray(load_pil_image(item))
        loaders["transformers load_image"] = lambda item: np.asarray(
            load_image(
                decoded(item)
                if isinstance(item, bytes)
                else Image.fromarray(item)
                if isinstance(item, np.ndarray)
                else item
            )
        )
    load = loaders[loader_name]
    items = forms()
    shared = 0
    for (name_a, a), (name_b, b) in itertools.combinations(items.items(), 2):
        if compute_image_hash(a) == compute_image_hash(b):
            shared += 1
            assert np.array_equal(load(a), load(b)), f"{name_a} and {name_b} share a key but load differently"
    assert shared == 2  # the two "again" copies, and only them
