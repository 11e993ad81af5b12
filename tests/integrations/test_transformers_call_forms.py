"""``CachedVisionModel.prepare`` takes the processor's own call forms, as the processor takes them.

LLaVA-OneVision reads the shape of ``images=``: a flat list's images are each prepared as alone in
their prompt (anyres tiles), one list for the prompt makes its images one multi-image group (one
base-size tile each). Both forms give ``model(**processor(text=..., images=...))``'s input ids and
logits (fp32, 1e-4), and the vision tower, counted on the model, encodes each distinct image once
per way it is prepared, the same tiles as transformers' own forward. A form the processor cannot
take is a typed error, with nothing cached and the tower not run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from PIL import Image

from tests.integrations.family_reference import logits, prompt, tower_runs
from visioncache.bench.family_models import FamilyModel, build_family_model
from visioncache.errors import (
    InvalidArgumentError,
    PlaceholderMismatchError,
    UnsupportedImageTypeError,
    UnsupportedInputTypeError,
)
from visioncache.integrations.transformers import CachedVisionModel

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def onevision() -> FamilyModel:
    return build_family_model("llava_onevision")


@pytest.fixture(scope="module")
def pictures() -> list[Image.Image]:
    rng = np.random.default_rng(11)
    return [Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)) for h, w in [(56, 84), (112, 70)]]


def processor_run(built: FamilyModel, text: str, images: Any) -> tuple[Any, torch.Tensor, int]:
    """transformers' own path: its inputs, logits and the tiles its vision tower encoded."""
    inputs = built.processor(text=[text], images=images, padding=True, return_tensors="pt")
    with tower_runs(built.model) as runs:
        expected = logits(built.model, inputs)
    return inputs, expected, sum(run[0] for run in runs)


def test_regression_a_flat_list_of_two_images_is_prepared_as_one_multi_image_group(
    onevision: FamilyModel, pictures: list[Image.Image]
) -> None:
    text = prompt(onevision.placeholder, 2)
    expected, _, tiles = processor_run(onevision, text, pictures)  # batch_num_images [1, 1]
    assert tiles > 2  # anyres: several tiles per image, not one base tile each
    cached = CachedVisionModel(onevision.model, onevision.processor)
    with tower_runs(onevision.model) as runs:
        inputs = cached.prepare(text, pictures)
    assert inputs["input_ids"].shape == expected["input_ids"].shape
    assert torch.equal(inputs["input_ids"], expected["input_ids"])
    assert sum(run[0] for run in runs) == tiles


def test_both_call_forms_match_transformers_and_encode_each_distinct_image_once(
    onevision: FamilyModel, pictures: list[Image.Image]
) -> None:
    a, b = pictures
    text = prompt(onevision.placeholder, 2)
    cached = CachedVisionModel(onevision.model, onevision.processor)
    lengths = []
    for images in ([a, b], [[a, b]]):  # a flat list, one list for the prompt
        expected_inputs, expected, tiles = processor_run(onevision, text, images)
        lengths.append(expected_inputs["input_ids"].shape[-1])
        for warm in (False, True):
            with tower_runs(onevision.model) as runs:
                inputs = cached.prepare(text, images)
            assert torch.equal(inputs["input_ids"], expected_inputs["input_ids"])
            assert float((logits(onevision.model, inputs) - expected).abs().max()) <= TOLERANCE
            assert sum(run[0] for run in runs) == (0 if warm else tiles)
    assert lengths[0] > lengths[1]  # the forms really differ: anyres tiles vs one base tile each
    # a and b, each prepared alone (flat) and in a group (nested): four encodes, no more.
    assert cached.times.images_encoded == 4
    with tower_runs(onevision.model) as runs:
        cached.prepare_batch([(text, [b, a]), (text, [[b, a]])])
    assert runs == [] and cached.times.images_encoded == 4


def test_forms_the_processor_cannot_take_are_typed_errors_and_change_nothing(
    onevision: FamilyModel, pictures: list[Image.Image]
) -> None:
    a, b = pictures
    cached = CachedVisionModel(onevision.model, onevision.processor)
    two = prompt(onevision.placeholder, 2)
    batch = np.stack([np.asarray(a.resize((32, 32)))] * 2)
    bad: list[tuple[Any, Any, type[Exception]]] = [
        (two, [a, [b]], InvalidArgumentError),  # images mixed with lists of images
        (two, [[a, [b]]], InvalidArgumentError),  # nested deeper than a list per prompt
        (two, [a], PlaceholderMismatchError),  # two placeholders, one image
        ([prompt(onevision.placeholder, 1)], [[a, b]], PlaceholderMismatchError),
        (two, batch, UnsupportedImageTypeError),  # a batch of images as one array
        (b"not a prompt", [a], UnsupportedInputTypeError),
    ]
    before = cached.cache.snapshot()
    with tower_runs(onevision.model) as runs:
        for text, images, error in bad:
            with pytest.raises(error):
                cached.prepare(text, images)
    assert runs == [] and cached.cache.snapshot() == before
    assert cached.times.images_preprocessed == 0


def test_image_outputs_take_each_requests_images_as_the_processor_takes_them(
    onevision: FamilyModel, pictures: list[Image.Image]
) -> None:
    text = prompt(onevision.placeholder, 2)
    cached = CachedVisionModel(onevision.model, onevision.processor)
    for images in (pictures, [pictures]):  # a flat list, one list for the prompt
        expected = onevision.processor(text=[text], images=images, padding=True, return_tensors="pt")
        inputs = cached.model_inputs([text], cached.image_outputs([images]))
        assert torch.equal(inputs["input_ids"], expected["input_ids"])
