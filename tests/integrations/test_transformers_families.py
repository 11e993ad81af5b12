"""Every described family, through a tiny random-weight model that keeps its published
checkpoint's processing settings (``bench/family_models/checkpoints.py``) and an offline
processor: CachedVisionModel's logits equal ``model(**processor(text=..., images=...))`` (fp32,
1e-4) for one image, two images of different sizes, the same image twice and the images swapped,
a batch of two prompts, and each call form the family's processor takes, cold and warm; the vision
tower (counted on the model) runs once per distinct image across requests, and a partial hit
encodes only the new image; each call form the processor refuses is refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from PIL import Image

from tests.integrations.family_reference import (
    build_or_skip,
    logits,
    prompt,
    reference_inputs,
    reference_logits,
    tower_runs,
)
from visioncache.bench.family_models import FAMILY_MODELS, FamilyModel
from visioncache.bench.family_models.checkpoints import CHECKPOINTS
from visioncache.errors import VisionCacheError
from visioncache.integrations.transformers import FAMILIES, CachedVisionModel

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4  # fp32, the bound
SIZES = [(56, 84), (112, 112), (70, 98)]  # (height, width): different token counts where resolution matters


@pytest.fixture(scope="module", params=FAMILY_MODELS)
def family(request: pytest.FixtureRequest) -> FamilyModel:
    return build_or_skip(request.param)


@pytest.fixture(scope="module")
def pictures() -> list[Image.Image]:
    rng = np.random.default_rng(7)
    return [Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)) for h, w in SIZES]


def difference(actual: Any, expected: Any) -> float:
    assert actual.shape == expected.shape
    return float((actual - expected).abs().max())


def plain(value: Any) -> Any:
    """A setting as JSON holds it: mappings as dicts (unset entries dropped), tuples as lists."""
    if hasattr(value, "items"):
        return {key: plain(item) for key, item in value.items() if item is not None}
    if isinstance(value, tuple | list):
        return [plain(item) for item in value]
    return value


# (tower rows, image tokens) of one 56x84 image, by the checkpoints' arithmetic: InternVL's 3:2
# grid of 448-pixel tiles plus a thumbnail, 256 tokens each; Idefics3 resized to 1456x1092, 4x3
# tiles of 364 plus the global image, 169 each; SmolVLM to 2048x1536, 4x3 tiles of 512 plus the
# global image, 64 each; LLaVA-OneVision's 384x384 grid point and the base patch, 729 features
# plus the grid's 27x27 unpadded to 19 rows with a newline each; Gemma 3 one 896-pixel square,
# 256; Qwen2-VL 4x6 patches of 14 pixels merged 2x2; Qwen3-VL enlarged to 65,536 pixels or more
# (224x320: 14x20 patches of 16 merged 2x2); GLM-4V enlarged until two frames hold 12,544
# pixels (84x112: 6x8 patches merged 2x2); Mistral 3 not enlarged, 4x6 patches merged 2x2.
TILING = {
    "internvl": (7, 7 * 256),
    "idefics3": (13, 13 * 169),
    "smolvlm": (13, 13 * 64),
    "llava_onevision": (2, 729 + 19 * 28),
    "gemma3": (1, 256),
    "qwen2_vl": (24, 6),
    "qwen2_5_vl": (24, 6),
    "qwen3_vl": (280, 70),
    "qwen3_5": (280, 70),
    "glm4v": (48, 12),
    "mistral3": (1, 6),
}


def test_the_tiny_model_keeps_its_checkpoints_processing_settings(
    family: FamilyModel, pictures: list[Image.Image]
) -> None:
    processor, config = family.processor, family.model.config
    checkpoint = CHECKPOINTS[family.family]
    held: list[tuple[str, Any, dict[str, Any]]] = [
        ("image processor", getattr(processor, "image_processor"), checkpoint.image_processor),  # noqa: B009
        ("processor", processor, checkpoint.processor),
        ("config", config, checkpoint.config),
        ("vision config", config.vision_config, checkpoint.vision),
    ]
    for where, holder, settings in held:
        for key, value in settings.items():
            assert plain(getattr(holder, key)) == plain(value), f"{where} {key}"
    if family.family not in TILING:  # Gemma 4: its count follows from max_soft_tokens and pooling, held above
        return
    rows, tokens = TILING[family.family]
    inputs = processor(text=[prompt(family.placeholder, 1)], images=[[pictures[0]]], return_tensors="pt")
    assert int((inputs["input_ids"] == config.image_token_id).sum()) == tokens
    assert stock_run(family.model, inputs)[1] == rows


def test_logits_equal_transformers_cold_and_warm(family: FamilyModel, pictures: list[Image.Image]) -> None:
    model, processor = family.model, family.processor
    a, b, _ = pictures
    cached = CachedVisionModel(model, processor)
    requests = [[a], [a, b], [a, a], [b, a]]  # one image, two sizes, the same twice, swapped
    for images in requests:
        text = prompt(family.placeholder, len(images))
        expected = reference_logits(model, processor, text, images)
        # One list for the prompt, as the reference passes them (call forms: test_each_call_form_...).
        assert difference(logits(model, cached.prepare(text, [images])), expected) <= TOLERANCE  # cold/hit
        assert difference(logits(model, cached.prepare(text, [images])), expected) <= TOLERANCE  # warm
    # The check can fail: the images swapped give other logits.
    text = prompt(family.placeholder, 2)
    assert (
        difference(
            reference_logits(model, processor, text, [a, b]), reference_logits(model, processor, text, [b, a])
        )
        > 1e-3
    )


def test_vision_tower_runs_once_per_distinct_image(family: FamilyModel, pictures: list[Image.Image]) -> None:
    model, processor = family.model, family.processor
    a, b, c = pictures
    cached = CachedVisionModel(model, processor)  # the load-time check runs before counting
    with tower_runs(model) as runs:
        for images in ([a], [a], [b], [a, b], [b, a], [a, a], [b, b]):
            cached.prepare(prompt(family.placeholder, len(images)), [images])
    # a, then b; LLaVA-OneVision prepares an image alone and among others differently: then
    # a and b once more, both in one call.
    assert len(runs) == (3 if FAMILIES[model.config.model_type].variant is not None else 2)
    with tower_runs(model) as partial:
        cached.prepare(prompt(family.placeholder, 2), [[c, a]])  # a hit, c new
    with tower_runs(model) as alone:  # c twice in a fresh cache: encoded once, alone
        CachedVisionModel(model, processor).prepare(prompt(family.placeholder, 2), [[c, c]])
    assert len(partial) == 1
    assert partial[0] == alone[0]  # the tower saw only the new image's pixels


def test_batch_of_requests_encodes_shared_misses_in_one_call(
    family: FamilyModel, pictures: list[Image.Image]
) -> None:
    model, processor = family.model, family.processor
    a, b, c = pictures
    cached = CachedVisionModel(model, processor)
    texts = [prompt(family.placeholder, 2), prompt(family.placeholder, 2, "what is in this picture")]
    with tower_runs(model) as runs:
        inputs = cached.prepare_batch([(texts[0], [[a, b]]), (texts[1], [[b, c]])])
    assert cached.times.images_encoded == 3
    assert len(runs) == (1 if cached.exactness.batched else 3)
    expected = logits(model, reference_inputs(model, processor, texts, [[a, b], [b, c]]))
    assert difference(logits(model, inputs), expected) <= TOLERANCE
    with tower_runs(model) as warm:
        inputs = cached.prepare_batch([(texts[0], [[a, b]]), (texts[1], [[b, c]])])
    assert warm == [] and cached.times.images_encoded == 3
    assert difference(logits(model, inputs), expected) <= TOLERANCE


BFLOAT16_BOUND = 1e-2  # the bound docs/transformers.md states; measured 0 on every family


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_bfloat16_logits_within_the_stated_bound(name: str, pictures: list[Image.Image]) -> None:
    built = build_or_skip(name, dtype=torch.bfloat16)
    a, b, _ = pictures
    cached = CachedVisionModel(built.model, built.processor)
    # Two sizes in one prompt, cold and warm (the order is the float32 tests'; a prompt of a
    # checkpoint's size costs seconds in bfloat16 on a CPU).
    text = prompt(built.placeholder, 2)
    expected = reference_logits(built.model, built.processor, text, [a, b])
    for _ in range(2):  # cold, then warm
        actual = logits(built.model, cached.prepare(text, [[a, b]]))
        assert difference(actual, expected) <= BFLOAT16_BOUND


def call_forms(placeholder: str, a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """(name, text, images): every shape of ``processor(text=..., images=...)``'s arguments."""
    one, two = prompt(placeholder, 1), prompt(placeholder, 2)
    batch = [prompt(placeholder, 1), prompt(placeholder, 1, "what is in this picture")]
    return [
        ("a bare image", one, a),
        ("a flat list", two, [a, b]),
        ("one list for the prompt", two, [[a, b]]),
        ("a list per image", two, [[a], [b]]),
        ("a batch, one list per prompt", batch, [[a], [b]]),
        ("a batch, a flat list", batch, [a, b]),
    ]


def stock_run(model: Any, inputs: Any) -> tuple[Any, int]:
    """transformers' own forward: its logits and the rows its vision tower encoded."""
    with tower_runs(model) as runs:
        expected = logits(model, inputs)
    return expected, sum(run[0] for run in runs)


def same_inputs(one: Any, other: Any) -> bool:
    return one.keys() == other.keys() and all(
        torch.is_tensor(one[key]) and torch.equal(one[key], other[key]) for key in one
    )


def test_each_call_form_the_processor_takes_gives_its_inputs_and_logits(
    family: FamilyModel, pictures: list[Image.Image]
) -> None:
    model, processor = family.model, family.processor
    a, b, _ = pictures
    cached = CachedVisionModel(model, processor)
    taken = []
    references: list[tuple[Any, tuple[Any, int]]] = []
    for name, text, images in call_forms(family.placeholder, a, b):
        texts = [text] if isinstance(text, str) else text
        try:
            expected = processor(text=texts, images=images, padding=True, return_tensors="pt")
        except (ValueError, TypeError):  # refused by the processor: refused alike, nothing cached
            before = cached.cache.snapshot()
            with pytest.raises(VisionCacheError):
                cached.prepare(text, images)
            assert cached.cache.snapshot() == before, name
            continue
        taken.append(name)
        # Cold (an empty cache), then warm: the processor's input ids and transformers' logits;
        # the tower encodes the rows transformers' forward encodes (a and b once each), then none.
        cached.cache.clear()
        # transformers' forward once per distinct input (forms the processor lays out alike share it)
        known = next((run for inputs, run in references if same_inputs(inputs, expected)), None)
        reference, rows = known if known is not None else stock_run(model, expected)
        references.append((expected, (reference, rows)))
        for warm in (False, True):
            with tower_runs(model) as runs:
                inputs = cached.prepare(text, images)
            assert torch.equal(inputs["input_ids"], expected["input_ids"]), name
            assert difference(logits(model, inputs), reference) <= TOLERANCE, name
            assert sum(run[0] for run in runs) == (0 if warm else rows), name
    # Every processor takes these; Gemma 3/4 and SmolVLM want one list per prompt for the others.
    assert {"a bare image", "a flat list", "one list for the prompt", "a batch, one list per prompt"} <= set(
        taken
    )
    # prepare_batch: each request's images as processor(text=[text], images=...) takes them.
    batch = [prompt(family.placeholder, 1), prompt(family.placeholder, 2, "compare them")]
    expected = processor(text=batch, images=[[a], [a, b]], padding=True, return_tensors="pt")
    inputs = cached.prepare_batch([(batch[0], [a]), (batch[1], [[a, b]])])
    assert torch.equal(inputs["input_ids"], expected["input_ids"])
