"""The load-time check: a family description is proven on the loaded model, not trusted by name.

A description with a wrong placeholder count, or whose split mixes the images of a batch, is
refused with the property that failed; a model whose tower output depends on its batch is
served one image per tower call, and says so.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from PIL import Image

from tests.integrations.family_reference import logits, prompt, reference_logits, tower_runs
from visioncache.bench.family_models import build_family_model
from visioncache.errors import ConfigurationError
from visioncache.integrations.transformers import CachedVisionModel, UntestedVersionWarning, call_forms
from visioncache.integrations.transformers.families import FAMILIES, process_images, split_rows
from visioncache.integrations.transformers.versions import check_transformers_version

pytestmark = pytest.mark.slow


def fresh_qwen() -> Any:
    return build_family_model("qwen2_vl")


def describe(monkeypatch: pytest.MonkeyPatch, **changes: Any) -> None:
    """Replace Qwen2-VL's description for the test."""
    monkeypatch.setitem(FAMILIES, "qwen2_vl", dataclasses.replace(FAMILIES["qwen2_vl"], **changes))


def one_token_short(processor: Any, images: list[Any], variant: Any, kwargs: dict[str, Any]) -> Any:
    outputs, replacements = process_images(processor, images, variant, kwargs)
    return outputs, [text.replace(processor.image_token, "", 1) for text in replacements]


def split_mixing_images(pooled: Any, counts: list[int]) -> list[Any]:
    """Right for one image; for several, each image takes rows from its neighbour."""
    parts = split_rows(pooled, counts[::-1])
    return parts[::-1]


def test_a_wrong_placeholder_count_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    describe(monkeypatch, preprocess=one_token_short)
    built = fresh_qwen()
    with pytest.raises(ConfigurationError, match="placeholder"):
        CachedVisionModel(built.model, built.processor)


def test_a_split_that_mixes_two_images_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    describe(monkeypatch, split=split_mixing_images)
    built = fresh_qwen()
    with pytest.raises(ConfigurationError, match=r"batching: .* mixes images"):
        CachedVisionModel(built.model, built.processor)


def test_the_stock_description_passes_and_is_checked_once_per_model() -> None:
    built = fresh_qwen()
    first = CachedVisionModel(built.model, built.processor)
    assert first.exactness.batched and first.exactness.max_difference <= 1e-4
    with tower_runs(built.model) as runs:
        second = CachedVisionModel(built.model, built.processor)
    assert runs == [] and second.exactness == first.exactness


def test_a_batch_dependent_tower_is_served_one_image_per_call(images: list[Image.Image]) -> None:
    built = fresh_qwen()
    inner = built.model.model
    encode = inner.get_image_features

    def batch_dependent(pixel_values: Any, image_grid_thw: Any, **kwargs: Any) -> Any:
        # Like a tower whose padding reaches the output: each image's features see the batch.
        output = encode(pixel_values, image_grid_thw, **kwargs)
        output.pooler_output = tuple(part + 0.05 * pixel_values.mean() for part in output.pooler_output)
        return output

    inner.get_image_features = batch_dependent
    cached = CachedVisionModel(built.model, built.processor)
    assert not cached.exactness.batched
    assert "one by one" in cached.exactness.reason
    text = prompt(built.placeholder, 1)
    for image in images[:2]:  # each image alone still equals transformers' forward
        actual = logits(built.model, cached.prepare(text, [image]))
        assert (
            float((actual - reference_logits(built.model, built.processor, text, [image])).abs().max())
            <= 1e-4
        )
    cached.prepare(prompt(built.placeholder, 2), images[2:4])
    assert (cached.times.images_encoded, cached.times.encoder_calls) == (4, 4)


def test_transformers_outside_the_tested_range_is_refused_and_newer_warns() -> None:
    for old in ("4.57.6", "5.19.0", "6.0.0"):
        with pytest.raises(ImportError, match=r"transformers >=5\.\d+\.\d+,<6"):
            check_transformers_version(old)
    with pytest.warns(UntestedVersionWarning, match="5.99.0 is newer"):
        check_transformers_version("5.99.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_transformers_version("5.25.0")


def test_a_layout_that_groups_a_flat_lists_images_is_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flat list laid out as one multi-image group (not as the processor lays it out) gives
    LLaVA-OneVision another prompt: the load-time check refuses the model, naming the form."""

    def one_group_per_list(layout: Any, made: list[Any]) -> list[tuple[int, int]]:
        index = {id(stand_in): position for position, stand_in in enumerate(made)}
        groups = layout if all(isinstance(group, list) for group in layout) else [layout]
        return [(index[id(image)], len(group)) for group in groups for image in group]

    monkeypatch.setattr(call_forms, "_groups", one_group_per_list)
    built = build_family_model("llava_onevision")
    with pytest.raises(ConfigurationError, match="call form a flat list in one prompt"):
        CachedVisionModel(built.model, built.processor)
