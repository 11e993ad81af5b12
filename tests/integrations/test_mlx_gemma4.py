"""Gemma 4's KV-reuse rule (`Gemma4.reusable_prefix`) on a tiny model with a short sliding window.

Gemma 4's image tokens attend each other both ways, its sliding-window layers attend the last
``sliding_window`` positions, and one attention mask serves every layer of a tail prefill. So a
prompt prefilled as a cached prefix plus a tail equals one prefill where the rule says so, and the
splits it refuses would change the logits: these tests check both on every split of two prompts,
one shorter and one longer than the window (the tails fed as vllm-mlx feeds a prefix hit's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="mlx cannot be imported here (pip install 'visioncache[mlx]')")
pytest.importorskip("mlx_vlm", reason="mlx-vlm cannot be imported here (pip install 'visioncache[mlx]')")

from mlx_vlm import utils as mlx_vlm_utils
from mlx_vlm.models.cache import make_prompt_cache

from tests.support.mlx_model_dir import save_model_dir
from visioncache.integrations.mlx_vlm.families import check_family, family_for
from visioncache.integrations.mlx_vlm.families.base import Feed
from visioncache.integrations.mlx_vlm.families.selfcheck import probe_images

pytestmark = pytest.mark.slow

WINDOW = 24  # positions a sliding-window layer attends in `short_window` (the tiny checkpoint: 512)


class Split:
    """One prompt, its full prefill, and its prefill split at any position."""

    def __init__(self, model: Any, processor: Any, prompt: str, image_count: int) -> None:
        self.model, self.family = model, family_for(model, processor)
        values = [
            self.family.encode(model, self.family.preprocess(processor, [image]))[0]
            for image in probe_images()
        ]
        self.input_ids = self.family.tokenize(processor, [prompt], values[:image_count])["input_ids"]
        self.feed: Feed = self.family.feed(
            model, self.input_ids, self.family.hook_inputs(model, values[:image_count])
        )
        self.whole = self.family.forward(
            model, self.feed, cache=make_prompt_cache(model.language_model)
        ).logits
        self.tokens = self.input_ids.reshape(-1).tolist()

    def exact(self, start: int, *, tail_mask: bool = True) -> bool:
        """The prefix ``[0, start)`` prefilled whole (as a stored prompt was), then the rest fed
        the family's window, as vllm-mlx feeds a prefix hit's tail: the same last logits?"""
        language_model, inputs = self.model.language_model, self.feed.inputs
        cache = make_prompt_cache(language_model)
        prefix = {
            name: inputs[name][:, :start]
            for name in ("inputs_embeds", "per_layer_inputs", "mm_token_type_ids")
        }
        language_model(None, cache=cache, **prefix)
        window = self.family.window(self.feed, start, len(self.tokens))
        if not tail_mask:
            window.pop("mask", None)
        tail = language_model(self.input_ids[:, start:], cache=cache, **window).logits
        return bool(mx.array_equal(tail[:, -1], self.whole[:, -1]).item())

    def reusable(self, start: int) -> bool:
        return self.family.reusable_prefix(self.model, self.tokens, start, start)

    def image_positions(self) -> np.ndarray:
        return np.flatnonzero(np.array(self.tokens) == self.family.image_token_id(self.model))


def load(path: Path, window: int | None = None) -> tuple[Any, Any]:
    """The tiny Gemma 4 in ``path``, its sliding window set to ``window`` (weights unchanged)."""
    if window is not None:
        config_path = path / "config.json"
        config = json.loads(config_path.read_text())
        config["text_config"]["sliding_window"] = window
        config_path.write_text(json.dumps(config))
    model, processor = mlx_vlm_utils.load(str(path))
    return model, processor


@pytest.fixture(scope="module")
def long_window(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    return load(save_model_dir(tmp_path_factory.mktemp("gemma4"), "gemma4"))


@pytest.fixture(scope="module")
def short_window(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    model, processor = load(save_model_dir(tmp_path_factory.mktemp("gemma4-window"), "gemma4"), WINDOW)
    assert model.config.text_config.sliding_window == WINDOW
    return model, processor


def test_within_the_window_every_split_between_images_is_exact(long_window: tuple[Any, Any]) -> None:
    """A tail holding an image is fed the whole prefill's mask (its image attending itself both
    ways); without it, the tail's image tokens would attend causally and the logits change."""
    model, processor = long_window
    marker = family_for(model, processor).marker(processor)
    split = Split(model, processor, f"look {marker} and {marker} please", 2)
    images = set(split.image_positions().tolist())
    assert len(split.tokens) <= model.config.text_config.sliding_window
    allowed = [start for start in range(1, len(split.tokens)) if split.reusable(start)]
    inside = [start for start in range(1, len(split.tokens)) if {start - 1, start} <= images]
    assert set(allowed) == set(range(1, len(split.tokens))) - set(inside)
    assert all(split.exact(start) for start in allowed)
    before_an_image = [start for start in allowed if start < max(images)]
    assert before_an_image and not any(split.exact(start, tail_mask=False) for start in before_an_image)
    assert not any(split.exact(start) for start in inside)  # an image's first tokens miss its last


def test_past_the_window_only_text_tails_are_reused_and_those_are_exact(
    short_window: tuple[Any, Any],
) -> None:
    model, processor = short_window
    marker = family_for(model, processor).marker(processor)
    words = " ".join(["tell me more about the colour of it"] * 3)
    split = Split(model, processor, f"look {marker} and {words} please", 1)
    last_image = int(split.image_positions().max())
    assert last_image < WINDOW < len(split.tokens)
    allowed = [start for start in range(1, len(split.tokens)) if split.reusable(start)]
    # A stored prefix past the window has rotated (its sliding layers lost keys): never reused.
    assert allowed == list(range(last_image + 1, WINDOW + 1))
    assert all(split.exact(start) for start in allowed)
    # With the image in the tail, the sliding layers' own mask has no image block: not exact.
    assert not any(split.exact(start) for start in range(1, last_image - 12))


def test_the_self_check_proves_the_splits_the_window_allows(
    short_window: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first probe (an image on each side of the split) does not fit this window; the probes
    with one image do, and prove KV reuse exact on this model."""
    model, processor = short_window
    family = family_for(model, processor)
    asked: list[bool] = []
    reusable_prefix = type(family).reusable_prefix

    def recording(self: Any, *args: Any) -> bool:
        asked.append(reusable_prefix(self, *args))
        return asked[-1]

    monkeypatch.setattr(type(family), "reusable_prefix", recording)
    assert check_family(family, model, processor).split_prefill
    assert asked == [False, True, True]
