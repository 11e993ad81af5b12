"""The connector's keys: digests of what the encoder is given. Each way two items could wrongly
share a key is a case here (vLLM's own field classes, no engine)."""

from __future__ import annotations

import torch
from vllm.multimodal.inputs import (
    MultiModalBatchedField,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    MultiModalSharedField,
)

from visioncache.integrations.vllm.encoder_inputs import encoder_input_digest

PIXELS = torch.arange(24, dtype=torch.float32).reshape(4, 6)
GRID = torch.tensor([1, 2, 2])


def _item(**fields: object) -> MultiModalKwargsItem:
    batched = MultiModalBatchedField()
    elements = {name: MultiModalFieldElem(data=value, field=batched) for name, value in fields.items()}
    return MultiModalKwargsItem(elements)


def _digest(item: MultiModalKwargsItem | None, *, modality: str = "image") -> bytes | None:
    return encoder_input_digest(modality, item)


def test_equal_inputs_share_a_digest() -> None:
    first = _digest(_item(pixel_values=PIXELS, image_grid_thw=GRID))
    second = _digest(_item(pixel_values=PIXELS.clone(), image_grid_thw=GRID))
    assert first is not None and len(first) == 32 and first == second


def test_collision_one_pixel_differs() -> None:
    changed = PIXELS.clone()
    changed[3, 5] += 1
    assert _digest(_item(pixel_values=PIXELS)) != _digest(_item(pixel_values=changed))


def test_collision_same_bytes_other_dtype() -> None:
    as_int = PIXELS.view(torch.int32)
    assert _digest(_item(pixel_values=PIXELS)) != _digest(_item(pixel_values=as_int))


def test_collision_same_bytes_other_shape() -> None:
    assert _digest(_item(pixel_values=PIXELS)) != _digest(_item(pixel_values=PIXELS.reshape(6, 4)))


def test_collision_same_tensors_under_other_field_names() -> None:
    assert _digest(_item(pixel_values=PIXELS, image_grid_thw=GRID)) != _digest(
        _item(pixel_values=GRID, image_grid_thw=PIXELS)
    )


def test_collision_a_list_of_tensors_and_their_concatenation() -> None:
    halves = [PIXELS[:2], PIXELS[2:]]
    assert _digest(_item(pixel_values=halves)) != _digest(_item(pixel_values=PIXELS))


def test_collision_other_modality_or_field_kind() -> None:
    item = _item(pixel_values=PIXELS)
    assert _digest(item, modality="image") != _digest(item, modality="video")
    shared = MultiModalKwargsItem(
        {"pixel_values": MultiModalFieldElem(data=PIXELS, field=MultiModalSharedField(batch_size=1))}
    )
    assert _digest(item) != _digest(shared)


def test_bf16_tensors_are_hashed_by_their_bytes() -> None:
    values = PIXELS.to(torch.bfloat16)
    nudged = values.clone()
    nudged.view(torch.int16)[0, 1] += 1  # the next bf16 value
    assert _digest(_item(pixel_values=values)) not in (None, _digest(_item(pixel_values=nudged)))


def test_inputs_the_scheduler_does_not_hold_have_no_digest() -> None:
    assert _digest(None) is None
    assert _digest(_item(pixel_values=None)) is None
    assert _digest(_item(pixel_values="address-of-shared-memory")) is None
