"""The mlx-vlm integration for Gemma 3, LLaVA, Mistral 3 and PaliGemma (the families stock vllm-mlx
0.6.0 cannot serve), in process, on tiny random-weight checkpoints with their real checkpoints'
processing settings (896 px / 256 soft tokens, CLIP at 336 px / 576 tokens, Pixtral 14 px patches
merged 2 x 2, SigLIP at 224 px / 256 tokens).

The reference is mlx-vlm's own ``generate`` on mlx-vlm's own inputs (`tests.support.mlx_oracle`):
cached features, cold and warm, must give its greedy tokens and their top-5 log-probs bit for bit,
with each distinct image through the tower once (counted on the tower class).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

mx = pytest.importorskip("mlx.core", reason="mlx cannot be imported here (pip install 'visioncache[mlx]')")
pytest.importorskip("mlx_vlm", reason="mlx-vlm cannot be imported here (pip install 'visioncache[mlx]')")

from mlx_vlm import utils as mlx_vlm_utils
from mlx_vlm.models.cache import make_prompt_cache

from tests.support.mlx_model_dir import save_model_dir
from tests.support.mlx_oracle import Oracle
from tests.support.mlx_towers import counted, tower_class
from visioncache import VisionEmbeddingCache
from visioncache.errors import PlaceholderMismatchError
from visioncache.integrations import mlx_vlm
from visioncache.integrations.mlx_vlm.families import check_family, family_for

pytestmark = pytest.mark.slow

FAMILIES = ["gemma3", "llava", "mistral3", "paligemma"]
ONE_IMAGE = {"paligemma"}  # one image per prompt, opening it (mlx-vlm's PaliGemma)
SIZES = [(112, 112), (84, 140), (140, 84)]  # (height, width)


def make_images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (*SIZES[index % len(SIZES)], 3), dtype=np.uint8))
        for index in range(count)
    ]


class Loaded:
    """A family's tiny model, loaded by mlx-vlm, with its reference."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path
        self.model, self.processor = mlx_vlm_utils.load(str(path))
        self.description = family_for(self.model, self.processor)
        self.exactness = check_family(self.description, self.model, self.processor)
        self.oracle = Oracle(loaded=(self.model, self.processor))

    def prompt(self, images: int) -> str:
        marker = self.description.marker(self.processor)
        if self.name in ONE_IMAGE:
            return marker * images + "describe the image"
        return f"user {' and '.join([marker] * images)} compare the image and the picture assistant"

    def cache(self) -> VisionEmbeddingCache:
        return VisionEmbeddingCache(namespace=mlx_vlm.cache_namespace("tiny", self.processor, self.model))


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    return Loaded(request.param, save_model_dir(tmp_path_factory.mktemp(request.param), request.param))


@pytest.fixture
def tower_calls(family: Loaded, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of images of every vision-tower call."""
    tower, images = tower_class(family.name)
    calls: list[int] = []
    monkeypatch.setattr(tower, "__call__", counted(tower.__call__, images, calls.append))
    return calls


def test_the_self_check_proves_batching_and_kv_reuse_where_they_are_exact(family: Loaded) -> None:
    assert family.exactness.batched
    # PaliGemma's prompt is attended both ways: no split of it is one prefill.
    assert family.exactness.split_prefill is (family.name not in ONE_IMAGE)


def test_cached_features_give_mlx_vlm_generates_tokens_cold_and_warm(
    family: Loaded, tower_calls: list[int]
) -> None:
    count = 1 if family.name in ONE_IMAGE else 2
    images, prompt = make_images(count, seed=1), family.prompt(count)
    expected = family.oracle.generate(family.oracle.inputs(prompt, images), max_tokens=4)
    cache = family.cache()
    for label in ("cold", "warm"):
        tower_calls.clear()
        inputs = mlx_vlm.prepare_inputs_with_features(
            family.model, family.processor, images, prompt, cache=cache
        )
        assert tower_calls == ([count] if label == "cold" else []), label
        # mlx-vlm's generate_step takes the cached inputs as they are ...
        assert family.oracle.generate(inputs, max_tokens=4) == expected, label
        # ... and the family's forward (serve-mlx's prefill) gives the first token's log-probs.
        logits = mlx_vlm.forward(family.model, inputs).logits[0, -1].astype(mx.float32)
        logprobs = np.array(logits - mx.logsumexp(logits))
        top = np.argsort(-logprobs, kind="stable")[:5]
        assert [[int(i), float(logprobs[i])] for i in top] == expected[0]["top"], label


def test_pixel_inputs_equal_mlx_vlms_own(family: Loaded) -> None:
    """The pixel-level drop-in: what mlx-vlm's inputs are, from cached pixels (LLaVA: its
    processor's, as mlx-vlm's prepare_inputs fails for it)."""
    count = 1 if family.name in ONE_IMAGE else 3
    images, prompt = make_images(count, seed=2), family.prompt(count)
    expected = family.oracle.inputs(prompt, images)
    cache = family.cache()
    for label in ("cold", "warm"):
        ours = mlx_vlm.prepare_inputs(family.processor, images=images, prompts=prompt, cache=cache)
        for name in ("input_ids", "attention_mask", "pixel_values"):
            assert mx.array_equal(mx.array(ours[name]), mx.array(expected[name])).item(), (label, name)
        if "image_sizes" in expected:
            assert np.array_equal(np.array(ours["image_sizes"]), np.array(expected["image_sizes"])), label


# ---- PaliGemma: one image, opening the prompt ----------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "images"),
    [("{m}{m}describe the images", 2), ("describe {m} the image", 1)],
    ids=["two images", "an image after text"],
)
def test_paligemma_prompts_mlx_vlm_would_answer_wrongly_are_refused_before_encoding(
    family: Loaded, tower_calls: list[int], prompt: str, images: int
) -> None:
    """mlx-vlm 0.7.10's PaliGemma encodes the first image of a prompt only and places features by
    position: such a prompt is refused (typed), before the tower runs or the cache changes."""
    if family.name not in ONE_IMAGE:
        pytest.skip("PaliGemma only")
    cache = family.cache()
    text = prompt.format(m=family.description.marker(family.processor))
    with pytest.raises(PlaceholderMismatchError, match="one image per prompt, opening it"):
        mlx_vlm.prepare_inputs_with_features(
            family.model, family.processor, make_images(images), text, cache=cache
        )
    assert tower_calls == [] and cache.get_stats()["embedding_cache_misses"] == 0


# ---- Gemma 3: KV reuse with sliding-window layers -------------------------------------------------


WINDOW = 300  # positions a sliding-window layer attends in `short_window` (gemma-3-4b: 1024)


@pytest.fixture(scope="module")
def short_window(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    path = save_model_dir(tmp_path_factory.mktemp("gemma3-window"), "gemma3")
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["sliding_window"] = WINDOW
    (path / "config.json").write_text(json.dumps(config))
    return mlx_vlm_utils.load(str(path))


def test_regression_gemma3_feed_is_not_scaled_in_place_and_splits_within_the_window_are_exact(
    short_window: tuple[Any, Any],
) -> None:
    """Regression: Gemma 3's language model scales its ``inputs_embeds`` in place (``h *= ...``),
    so a feed prefilled once had its embeddings scaled again when a KV prefix hit's tail read
    them: the split-prefill probe found KV reuse inexact. The family's forward gives it a copy;
    a tail fed as vllm-mlx feeds a prefix hit's then gives one prefill's logits, where the rule
    (`Gemma3.reusable_prefix`) allows the split, and past the window a stored prefix is refused."""
    model, processor = short_window
    family = family_for(model, processor)
    marker = family.marker(processor)
    words = " ".join(["tell me more about the colour of it"] * 6)
    values = family.encode(model, family.preprocess(processor, make_images(1)))
    input_ids = family.tokenize(processor, [f"look {marker} and {words} please"], values)["input_ids"]
    tokens = input_ids.reshape(-1).tolist()
    feed = family.feed(model, input_ids, family.hook_inputs(model, values))
    before = mx.array(feed.inputs_embeds)
    whole = family.forward(model, feed, cache=make_prompt_cache(model.language_model)).logits[:, -1]
    assert mx.array_equal(feed.inputs_embeds, before).item()  # the feed is as it was
    assert len(tokens) > WINDOW
    language_model = model.language_model
    starts = sorted({*range(1, len(tokens), 23), WINDOW - 1, WINDOW, WINDOW + 1, len(tokens) - 1})
    allowed = []
    for start in starts:
        if not family.reusable_prefix(model, tokens, start, start):
            continue
        allowed.append(start)
        cache = make_prompt_cache(language_model)
        language_model(input_ids[:, :start], inputs_embeds=feed.inputs_embeds[:, :start], cache=cache)
        window = family.window(feed, start, len(tokens))
        tail = language_model(input_ids[:, start:], cache=cache, **window).logits[:, -1]
        assert mx.array_equal(tail, whole).item(), start
    assert allowed == [start for start in starts if start <= WINDOW]  # a stored prefix past it rotated
    assert check_family(family, model, processor).split_prefill
