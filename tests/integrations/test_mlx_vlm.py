"""visioncache.integrations.mlx_vlm.adapter on real mlx-vlm architectures with tiny random weights (mlx-cpu).

A hit must give the model exactly what a miss gives: the tests compare logits bit for bit and
greedy tokens against mlx-vlm without visioncache, with the cache disabled, cold and warm, and
count what reaches the image processor and the vision tower.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from PIL import Image

mx = pytest.importorskip("mlx.core", reason="mlx cannot be imported here (pip install 'visioncache[mlx]')")
pytest.importorskip("mlx_vlm", reason="mlx-vlm cannot be imported here (pip install 'visioncache[mlx]')")

from mlx_vlm import utils as mlx_vlm_utils  # noqa: E402
from mlx_vlm.generate import generate_step  # noqa: E402

from tests.support.mlx_model_dir import build_random_processor  # noqa: E402
from visioncache import ConfigurationError, VisionEmbeddingCache  # noqa: E402
from visioncache.bench.mlx_random_model import build_random_model  # noqa: E402
from visioncache.bench.workload import question_prompt as chat_prompt  # noqa: E402
from visioncache.errors import PlaceholderMismatchError  # noqa: E402
from visioncache.integrations import mlx_vlm  # noqa: E402

FAMILIES = ["qwen2_vl", "qwen2_5_vl"]


def make_images(count: int, seed: int = 0) -> list[Image.Image]:
    """Distinct random 56x56 images (every third one 56x84, so grids differ)."""
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray((rng.random((56, 84 if index % 3 == 1 else 56, 3)) * 255).astype(np.uint8))
        for index in range(count)
    ]


def new_cache(model: Any | None, processor: Any, enabled: bool = True) -> VisionEmbeddingCache:
    return VisionEmbeddingCache(
        enabled=enabled, namespace=mlx_vlm.cache_namespace("random-tiny", processor, model)
    )


def mlx_vlm_prepare_inputs(processor: Any, images: list[Any], prompts: list[str]) -> dict[str, Any]:
    """mlx-vlm's own ``prepare_inputs``: what visioncache must reproduce."""
    prepare: Any = mlx_vlm_utils.prepare_inputs
    return dict(prepare(processor, images=images, prompts=prompts))


def split_inputs(inputs: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """input_ids, pixel_values, mask and the model's other keyword arguments."""
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
    return inputs["input_ids"], inputs["pixel_values"], inputs["attention_mask"], extra


def logits_of(model: Any, inputs: dict[str, Any]) -> Any:
    input_ids, pixel_values, mask, extra = split_inputs(inputs)
    logits = model(input_ids, pixel_values, mask=mask, **extra).logits
    mx.eval(logits)
    return logits


def greedy_tokens(model: Any, inputs: dict[str, Any], count: int = 4) -> list[int]:
    input_ids, pixel_values, mask, extra = split_inputs(inputs)
    steps = generate_step(input_ids, model, pixel_values, mask, max_tokens=count, temperature=0.0, **extra)
    return [int(token) for token, _ in steps]


@pytest.fixture(scope="module", params=FAMILIES)
def model_and_processor(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    return build_random_model(request.param)


@pytest.fixture
def tower_calls(
    model_and_processor: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> list[list[list[int]]]:
    """The image grids of every vision-tower call (one list per call)."""
    tower_class = type(model_and_processor[0].vision_tower)
    original = tower_class.__call__
    calls: list[list[list[int]]] = []

    def counting_call(self: Any, pixel_values: Any, grid_thw: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(grid_thw.tolist())
        return original(self, pixel_values, grid_thw, *args, **kwargs)

    monkeypatch.setattr(tower_class, "__call__", counting_call)
    return calls


@pytest.fixture
def preprocess_calls(
    model_and_processor: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[int]]:
    """The number of images of every image-processor call."""
    processor_class = type(model_and_processor[1].image_processor)
    original = processor_class.__call__
    calls: list[int] = []

    def counting_call(self: Any, images: Any, **kwargs: Any) -> Any:
        calls.append(len(images))
        return original(self, images, **kwargs)

    monkeypatch.setattr(processor_class, "__call__", counting_call)
    yield calls


@pytest.mark.slow
def test_prepare_inputs_equals_mlx_vlm_cold_and_warm_without_preprocessing_on_hits(
    model_and_processor: tuple[Any, Any], preprocess_calls: list[int]
) -> None:
    model, processor = model_and_processor
    images = make_images(3)
    # Two prompts in one batch: images are consumed across prompts in order, with left padding.
    prompts = [chat_prompt("describe the image", 2), chat_prompt("what is in this picture", 1)]
    expected = mlx_vlm_prepare_inputs(processor, images=images, prompts=prompts)
    cache = new_cache(model, processor)
    preprocess_calls.clear()
    for _ in ("cold", "warm"):
        ours = mlx_vlm.prepare_inputs(processor, images=images, prompts=prompts, cache=cache)
        assert sorted(ours) == sorted(expected)
        for name, value in expected.items():
            assert ours[name].dtype == value.dtype, name
            assert mx.array_equal(ours[name], value).item(), name
    assert preprocess_calls == [3]  # the warm request was tokenised from the cached grids alone


@pytest.mark.slow
def test_logits_and_greedy_tokens_identical_disabled_cold_and_warm(
    model_and_processor: tuple[Any, Any], tower_calls: list[list[list[int]]]
) -> None:
    model, processor = model_and_processor
    images = make_images(2, seed=1)
    prompt = chat_prompt("compare the image and the picture", 2)
    baseline = mlx_vlm_prepare_inputs(processor, images=images, prompts=[prompt])
    expected_logits, expected_tokens = logits_of(model, baseline), greedy_tokens(model, baseline)
    disabled, cache = new_cache(model, processor, enabled=False), new_cache(model, processor)
    for label, used_cache in (("disabled", disabled), ("cold", cache), ("warm", cache)):
        tower_calls.clear()
        inputs = mlx_vlm.prepare_inputs_with_features(model, processor, images, prompt, cache=used_cache)
        assert mx.array_equal(logits_of(model, inputs), expected_logits).item(), label
        assert greedy_tokens(model, inputs) == expected_tokens, label
        assert len(tower_calls) == (0 if label == "warm" else 1), label
        pixel_inputs = mlx_vlm.prepare_inputs(processor, images=images, prompts=prompt, cache=used_cache)
        assert mx.array_equal(logits_of(model, pixel_inputs), expected_logits).item(), label


@pytest.mark.slow
def test_partial_hits_send_only_missing_images_to_the_tower_in_one_call(
    model_and_processor: tuple[Any, Any], tower_calls: list[list[list[int]]], preprocess_calls: list[int]
) -> None:
    model, processor = model_and_processor
    a, b, c, d = make_images(4, seed=2)
    cache = new_cache(model, processor)
    images = [c, b, a, d]  # c and a cached below; b (56x84) and d (56x56) new
    prompt = chat_prompt("describe the image", 4)
    expected = logits_of(model, mlx_vlm_prepare_inputs(processor, images=images, prompts=[prompt]))
    mlx_vlm.prepare_inputs_with_features(model, processor, [a, c], chat_prompt("a", 2), cache=cache)
    tower_calls.clear()
    preprocess_calls.clear()

    inputs = mlx_vlm.prepare_inputs_with_features(model, processor, images, prompt, cache=cache)

    assert tower_calls == [[[1, 4, 6], [1, 4, 4]]]  # b then d, in one call
    assert preprocess_calls == [2]
    assert mx.array_equal(logits_of(model, inputs), expected).item()
    # A request repeating cached images (even twice in one request) runs nothing.
    tower_calls.clear()
    mlx_vlm.prepare_inputs_with_features(model, processor, [d, d], chat_prompt("a", 2), cache=cache)
    assert tower_calls == []


@pytest.mark.slow
def test_path_bytes_and_data_url_of_one_image_share_entries(
    model_and_processor: tuple[Any, Any],
    tower_calls: list[list[list[int]]],
    preprocess_calls: list[int],
    tmp_path: Path,
) -> None:
    model, processor = model_and_processor
    path = tmp_path / "photo.png"
    make_images(2, seed=4)[1].save(path)
    encoded = path.read_bytes()
    forms = [str(path), path, encoded, "data:image/png;base64," + base64.b64encode(encoded).decode()]
    prompt = chat_prompt("describe the image", 1)
    expected = mlx_vlm_prepare_inputs(processor, images=[str(path)], prompts=[prompt])
    expected_logits = logits_of(model, expected)
    cache = new_cache(model, processor)
    tower_calls.clear()
    preprocess_calls.clear()
    for image in forms:
        ours = mlx_vlm.prepare_inputs(processor, images=[image], prompts=prompt, cache=cache)
        assert mx.array_equal(ours["pixel_values"], expected["pixel_values"]).item(), type(image)
        inputs = mlx_vlm.prepare_inputs_with_features(model, processor, [image], prompt, cache=cache)
        assert mx.array_equal(logits_of(model, inputs), expected_logits).item(), type(image)
    assert preprocess_calls == [1]
    assert len(tower_calls) == 1


@pytest.mark.slow
def test_a_batch_of_prompts_with_left_padding_gives_mlx_vlm_logits(
    model_and_processor: tuple[Any, Any],
) -> None:
    model, processor = model_and_processor
    images = make_images(3, seed=6)
    prompts = [chat_prompt("describe the image", 2), chat_prompt("what is in this picture a cat", 1)]
    expected = logits_of(model, mlx_vlm_prepare_inputs(processor, images=images, prompts=prompts))
    cache = new_cache(model, processor)
    for label in ("cold", "warm"):
        inputs = mlx_vlm.prepare_inputs_with_features(model, processor, images, prompts, cache=cache)
        assert mx.array_equal(logits_of(model, inputs), expected).item(), label


@pytest.mark.slow
def test_entries_are_mlx_arrays_sized_by_nbytes(model_and_processor: tuple[Any, Any]) -> None:
    model, processor = model_and_processor
    images = make_images(3, seed=3)
    cache = new_cache(model, processor)
    mlx_vlm.prepare_inputs_with_features(model, processor, images, chat_prompt("a", 3), cache=cache)

    embeddings: list[Any] = cache.get_image_embeddings(images)
    pixels: list[Any] = [cache.get_pixel_values([image]) for image in images]
    assert None not in embeddings and None not in pixels
    arrays = [array for value in embeddings for array in value.values()]
    arrays += [array for entry in pixels for array in (entry.pixel_values, entry.image_grid_thw)]
    assert all(isinstance(array, mx.array) for array in arrays)
    stats = cache.get_stats()
    assert stats["embedding_cache_bytes"] == sum(a.nbytes for v in embeddings for a in v.values())
    assert stats["pixel_only_cache_bytes"] == sum(
        entry.pixel_values.nbytes + entry.image_grid_thw.nbytes for entry in pixels
    )
    # Each image's features are one row per merged 2x2 patch of its own grid.
    rows = [value["image_features"].shape[0] for value in embeddings]
    assert rows == [4, 6, 4]


def test_cache_namespace_follows_processor_configuration() -> None:
    first, second = build_random_processor("qwen2_vl"), build_random_processor("qwen2_vl")
    assert mlx_vlm.cache_namespace("m", first) == mlx_vlm.cache_namespace("m", second)
    second.image_processor.max_pixels = 28 * 28 * 64
    assert mlx_vlm.cache_namespace("m", first) != mlx_vlm.cache_namespace("m", second)
    assert mlx_vlm.cache_namespace("m", first) != mlx_vlm.cache_namespace("n", first)


@pytest.mark.slow
def test_cache_without_matching_namespace_is_refused() -> None:
    model, processor = build_random_model("qwen2_vl")
    images, prompt = make_images(1), chat_prompt("a", 1)
    for cache in (VisionEmbeddingCache(), new_cache(None, build_random_processor("qwen2_vl"))):
        with pytest.raises(ConfigurationError, match="namespace"):
            mlx_vlm.prepare_inputs_with_features(model, processor, images, prompt, cache=cache)
    processor.image_processor.min_pixels = 28 * 28 * 8  # changed after the cache was built
    cache = new_cache(model, build_random_processor("qwen2_vl"))
    with pytest.raises(ConfigurationError, match="namespace"):
        mlx_vlm.prepare_inputs(processor, images=images, prompts=prompt, cache=cache)


def test_namespace_check_is_structural_not_a_substring_test() -> None:
    """Regression: the check was ``";processor=<fp>" in namespace``, so a namespace that
    merely contained the right fingerprint (in a longer field, or inside the model name) passed."""
    processor = build_random_processor("qwen2_vl")
    fields = mlx_vlm.parse_namespace(mlx_vlm.cache_namespace("org/model;rev=1", processor))
    assert fields is not None and fields.model_name == "org/model;rev=1" and fields.model is None
    other = build_random_processor("qwen2_vl")
    other.image_processor.max_pixels = 28 * 28 * 64
    other_fields = mlx_vlm.parse_namespace(mlx_vlm.cache_namespace("m", other))
    assert other_fields is not None and other_fields.processor != fields.processor
    impostors = [
        f"mlx-vlm:m;processor={fields.processor}0",  # the right fingerprint as a prefix of the field
        f"mlx-vlm:m;processor={fields.processor};x;processor={other_fields.processor}",  # in the name
        f"cache mlx-vlm:m;processor={fields.processor}",  # not a cache_namespace at all
    ]
    for namespace in impostors:
        with pytest.raises(ConfigurationError, match="namespace"):
            mlx_vlm.prepare_inputs(
                processor,
                images=make_images(1),
                prompts=chat_prompt("a", 1),
                cache=VisionEmbeddingCache(namespace=namespace),
            )
    accepted = VisionEmbeddingCache(namespace=mlx_vlm.cache_namespace("org/model;rev=1", processor))
    mlx_vlm.prepare_inputs(processor, images=make_images(1), prompts=chat_prompt("a", 1), cache=accepted)


def test_unsupported_family_and_processor_raise_configuration_error() -> None:
    processor = build_random_processor("qwen2_vl")
    qwen3 = SimpleNamespace(config=SimpleNamespace(model_type="qwen3_vl"))
    with pytest.raises(ConfigurationError, match="qwen3_vl"):
        mlx_vlm.cache_namespace("m", processor, qwen3)
    with pytest.raises(ConfigurationError, match="qwen3_vl"):
        mlx_vlm.image_feature_encoder(qwen3, processor, VisionEmbeddingCache())
    with pytest.raises(ConfigurationError, match="not supported"):
        mlx_vlm.cache_namespace("m", SimpleNamespace(image_processor=processor.image_processor))


def test_placeholder_count_must_match_images() -> None:
    processor = build_random_processor("qwen2_vl")
    cache = new_cache(None, processor)
    with pytest.raises(PlaceholderMismatchError, match="1 image placeholder"):
        mlx_vlm.prepare_inputs(processor, images=make_images(2), prompts=chat_prompt("a", 1), cache=cache)


def test_missing_mlx_vlm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    processor = build_random_processor("qwen2_vl")
    monkeypatch.setitem(sys.modules, "mlx_vlm.utils", None)  # makes `import mlx_vlm.utils` fail
    with pytest.raises(ImportError, match=r"visioncache\[mlx\]"):
        mlx_vlm.prepare_inputs(processor, images=make_images(1), prompts="a", cache=VisionEmbeddingCache())
