"""visioncache.integrations.mlx_vlm on real mlx-vlm architectures with tiny random weights (mlx-cpu),
for every family it describes.

A hit must give the model exactly what a miss gives: the tests compare logits bit for bit and
greedy tokens against mlx-vlm without visioncache, with the cache disabled, cold and warm, and
count what reaches the image processor and the vision tower (counted on the model's tower class).
Each family's model is a tiny checkpoint saved to a directory and loaded by ``mlx_vlm.load``, with
the family's real processor.
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

from mlx_vlm import utils as mlx_vlm_utils
from mlx_vlm.generate import generate_step

from tests.support.mlx_model_dir import build_random_processor, save_model_dir
from tests.support.mlx_towers import counted, tower_class
from visioncache import ConfigurationError, VisionEmbeddingCache
from visioncache.errors import PlaceholderMismatchError
from visioncache.integrations import mlx_vlm
from visioncache.integrations.mlx_vlm.families import check_family, family_for

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "idefics3", "smolvlm", "gemma4"]
# mlx-vlm 0.7.10's own path cannot take a batch of several prompts for these (its forward passes a
# padded batch's mask to attention as it is; SmolVLM's processor wants images nested per prompt):
# nothing to compare with, so they are tested one prompt at a time.
NO_PADDED_BATCH = {"idefics3", "smolvlm"}
SIZES = [(56, 56), (56, 84), (84, 56), (28, 112)]  # (height, width): different grids and tile layouts


def make_images(count: int, seed: int = 0) -> list[Image.Image]:
    """Distinct random images of different sizes."""
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (*SIZES[index % len(SIZES)], 3), dtype=np.uint8))
        for index in range(count)
    ]


class Family:
    """A loaded tiny model of one family, and how its prompts mark images."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path
        self.model, self.processor = mlx_vlm_utils.load(str(path))
        self.description = family_for(self.model, self.processor)
        check_family(self.description, self.model, self.processor)  # its probe images, before counting

    def prompt(self, question: str, num_images: int = 1) -> str:
        marker = self.description.marker(self.processor)
        return f"user {' '.join([marker] * num_images)} {question} assistant"


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    return Family(request.param, save_model_dir(tmp_path_factory.mktemp(request.param), request.param))


def new_cache(family: Family, with_model: bool = True, enabled: bool = True) -> VisionEmbeddingCache:
    model = family.model if with_model else None
    return VisionEmbeddingCache(
        enabled=enabled, namespace=mlx_vlm.cache_namespace("random-tiny", family.processor, model)
    )


def mlx_vlm_prepare_inputs(processor: Any, images: list[Any], prompts: list[str]) -> dict[str, Any]:
    """mlx-vlm's own ``prepare_inputs``: what visioncache must reproduce."""
    prepare: Any = mlx_vlm_utils.prepare_inputs
    return dict(prepare(processor, images=images, prompts=prompts))


def split_inputs(inputs: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """input_ids, pixel_values, mask and the model's other keyword arguments."""
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
    return inputs["input_ids"], inputs["pixel_values"], inputs["attention_mask"], extra


def uncached_logits(model: Any, inputs: dict[str, Any]) -> Any:
    """The model's own forward, as mlx-vlm's ``generate`` and vllm-mlx run it: Gemma 4's language
    model is given no padding mask there (``mask=`` would be every layer's attention mask)."""
    input_ids, pixel_values, mask, extra = split_inputs(inputs)
    masks = {} if model.config.model_type == "gemma4" else {"mask": mask}
    logits = model(input_ids, pixel_values, **masks, **extra).logits
    mx.eval(logits)
    return logits


def same_arrays(first: Any, second: Any) -> bool:
    """Equal mlx arrays (dtype included), or equal lists of them (Gemma 4's pixels of images of
    different sizes, which mlx-vlm leaves numpy arrays)."""
    if isinstance(first, list) or isinstance(second, list):
        return (
            isinstance(first, list)
            and isinstance(second, list)
            and len(first) == len(second)
            and all(same_arrays(a, b) for a, b in zip(first, second, strict=True))
        )
    first, second = mx.array(first), mx.array(second)
    return bool(first.dtype == second.dtype and mx.array_equal(first, second).item())


def cached_logits(model: Any, inputs: dict[str, Any]) -> Any:
    logits = mlx_vlm.forward(model, inputs).logits
    mx.eval(logits)
    return logits


def greedy_tokens(model: Any, inputs: dict[str, Any], count: int = 4) -> list[int]:
    input_ids, pixel_values, mask, extra = split_inputs(inputs)
    steps = generate_step(input_ids, model, pixel_values, mask, max_tokens=count, temperature=0.0, **extra)
    return [int(token) for token, _ in steps]


@pytest.fixture
def tower_calls(family: Family, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of images (tiles for Idefics3 / SmolVLM) of every vision-tower call."""
    tower, images = tower_class(family.name)
    calls: list[int] = []
    monkeypatch.setattr(tower, "__call__", counted(tower.__call__, images, calls.append))
    return calls


@pytest.fixture
def preprocess_calls(family: Family, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The number of images of every image-processor call."""
    processor_class = type(family.processor.image_processor)
    original = processor_class.__call__
    calls: list[int] = []

    def counting_call(self: Any, images: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(images))
        return original(self, images, *args, **kwargs)

    monkeypatch.setattr(processor_class, "__call__", counting_call)
    yield calls


@pytest.mark.slow
def test_prepare_inputs_equals_mlx_vlm_cold_and_warm_without_preprocessing_on_hits(
    family: Family, preprocess_calls: list[int]
) -> None:
    images = make_images(3)
    # Two prompts in one batch: images are consumed across prompts in order, with left padding.
    prompts = [family.prompt("describe the image", 2), family.prompt("what is in this picture", 1)]
    if family.name in NO_PADDED_BATCH:
        prompts = [family.prompt("describe the image", 3)]
    expected = mlx_vlm_prepare_inputs(family.processor, images=images, prompts=prompts)
    cache = new_cache(family, with_model=False)
    preprocess_calls.clear()
    for _ in ("cold", "warm"):
        ours = mlx_vlm.prepare_inputs(family.processor, images=images, prompts=prompts, cache=cache)
        assert sorted(ours) == sorted(expected)
        for name, value in expected.items():
            assert same_arrays(ours[name], value), name
    assert preprocess_calls == [3]  # the warm request was tokenised from the cached layouts alone


@pytest.mark.slow
def test_logits_and_greedy_tokens_identical_disabled_cold_and_warm(
    family: Family, tower_calls: list[int]
) -> None:
    model, processor = family.model, family.processor
    images = make_images(2, seed=1)
    prompt = family.prompt("compare the image and the picture", 2)
    baseline = mlx_vlm_prepare_inputs(processor, images=images, prompts=[prompt])
    expected_logits, expected_tokens = uncached_logits(model, baseline), greedy_tokens(model, baseline)
    disabled, cache = new_cache(family, enabled=False), new_cache(family)
    for label, used_cache in (("disabled", disabled), ("cold", cache), ("warm", cache)):
        tower_calls.clear()
        inputs = mlx_vlm.prepare_inputs_with_features(model, processor, images, prompt, cache=used_cache)
        assert mx.array_equal(cached_logits(model, inputs), expected_logits).item(), label
        assert greedy_tokens(model, inputs) == expected_tokens, label
        assert len(tower_calls) == (0 if label == "warm" else 1), label
        pixel_inputs = mlx_vlm.prepare_inputs(processor, images=images, prompts=prompt, cache=used_cache)
        assert mx.array_equal(uncached_logits(model, pixel_inputs), expected_logits).item(), label


@pytest.mark.slow
def test_partial_hits_send_only_missing_images_to_the_tower_in_one_call(
    family: Family, tower_calls: list[int], preprocess_calls: list[int]
) -> None:
    model, processor = family.model, family.processor
    a, b, c, d = make_images(4, seed=2)
    cache = new_cache(family)
    images = [c, b, a, d]  # c and a cached below; b and d new
    prompt = family.prompt("describe the image", 4)
    expected = uncached_logits(model, mlx_vlm_prepare_inputs(processor, images=images, prompts=[prompt]))
    mlx_vlm.prepare_inputs_with_features(model, processor, [a, c], family.prompt("a", 2), cache=cache)
    alone = []
    for image in (b, d):  # what b and d cost the tower on their own
        tower_calls.clear()
        mlx_vlm.prepare_inputs_with_features(
            model, processor, [image], family.prompt("a"), cache=new_cache(family)
        )
        alone.append(sum(tower_calls))
    tower_calls.clear()
    preprocess_calls.clear()

    inputs = mlx_vlm.prepare_inputs_with_features(model, processor, images, prompt, cache=cache)

    assert tower_calls == [sum(alone)]  # b and d, in one call
    assert preprocess_calls == [2]
    assert mx.array_equal(cached_logits(model, inputs), expected).item()
    # A request repeating cached images (even twice in one request) runs nothing.
    tower_calls.clear()
    mlx_vlm.prepare_inputs_with_features(model, processor, [d, d], family.prompt("a", 2), cache=cache)
    assert tower_calls == []


@pytest.mark.slow
def test_a_batch_of_prompts_with_left_padding_gives_mlx_vlm_logits(family: Family) -> None:
    if family.name in NO_PADDED_BATCH:
        pytest.skip(f"mlx-vlm's own {family.name} path cannot run a batch of several prompts")
    model, processor = family.model, family.processor
    images = make_images(3, seed=6)
    prompts = [family.prompt("describe the image", 2), family.prompt("what is in this picture a cat", 1)]
    expected = uncached_logits(model, mlx_vlm_prepare_inputs(processor, images=images, prompts=prompts))
    cache = new_cache(family)
    for label in ("cold", "warm"):
        inputs = mlx_vlm.prepare_inputs_with_features(model, processor, images, prompts, cache=cache)
        assert mx.array_equal(cached_logits(model, inputs), expected).item(), label


@pytest.mark.slow
def test_entries_are_mlx_arrays_sized_by_nbytes(family: Family) -> None:
    model, processor = family.model, family.processor
    images = make_images(4, seed=3)
    cache = new_cache(family)
    mlx_vlm.prepare_inputs_with_features(model, processor, images, family.prompt("a", 4), cache=cache)

    embeddings: list[Any] = cache.get_image_embeddings(images)
    pixels: list[Any] = [cache.get_pixel_values([image]) for image in images]
    assert None not in embeddings and None not in pixels
    from visioncache.trees import tree_nbytes

    arrays = [array for value in embeddings for array in value.values() if not isinstance(array, int)]
    assert arrays and all(isinstance(array, mx.array) for array in arrays)
    stats = cache.get_stats()
    assert stats["embedding_cache_bytes"] == sum(tree_nbytes(value) for value in embeddings)
    assert stats["pixel_only_cache_bytes"] == sum(tree_nbytes(entry) for entry in pixels)
    # Each image's features are one row per image token of its own layout.
    description = family.description
    rows = [value["image_features"].shape[0] for value in embeddings]
    assert rows == [description.token_count(model, value) for value in embeddings]
    assert len(set(rows)) > 1  # the layouts differ, and so do the row counts


@pytest.mark.slow
def test_path_bytes_and_data_url_of_one_image_share_entries(tmp_path: Path) -> None:
    family = Family("qwen2_vl", save_model_dir(tmp_path / "model", "qwen2_vl"))
    model, processor = family.model, family.processor
    path = tmp_path / "photo.png"
    make_images(2, seed=4)[1].save(path)
    encoded = path.read_bytes()
    forms = [str(path), path, encoded, "data:image/png;base64," + base64.b64encode(encoded).decode()]
    prompt = family.prompt("describe the image", 1)
    expected = mlx_vlm_prepare_inputs(processor, images=[str(path)], prompts=[prompt])
    expected_logits = uncached_logits(model, expected)
    cache = new_cache(family)
    tower, _ = tower_class("qwen2_vl")
    calls = []
    original = tower.__call__
    tower.__call__ = lambda self, *args, **kwargs: calls.append(1) or original(self, *args, **kwargs)
    try:
        for image in forms:
            ours = mlx_vlm.prepare_inputs(processor, images=[image], prompts=prompt, cache=cache)
            assert mx.array_equal(ours["pixel_values"], expected["pixel_values"]).item(), type(image)
            inputs = mlx_vlm.prepare_inputs_with_features(model, processor, [image], prompt, cache=cache)
            assert mx.array_equal(cached_logits(model, inputs), expected_logits).item(), type(image)
    finally:
        tower.__call__ = original
    assert len(calls) == 1


def test_cache_namespace_follows_processor_configuration() -> None:
    first, second = build_random_processor("qwen2_vl"), build_random_processor("qwen2_vl")
    assert mlx_vlm.cache_namespace("m", first) == mlx_vlm.cache_namespace("m", second)
    second.image_processor.max_pixels = 28 * 28 * 64
    assert mlx_vlm.cache_namespace("m", first) != mlx_vlm.cache_namespace("m", second)
    assert mlx_vlm.cache_namespace("m", first) != mlx_vlm.cache_namespace("n", first)


@pytest.mark.slow
def test_cache_without_matching_namespace_is_refused(tmp_path: Path) -> None:
    family = Family("qwen2_vl", save_model_dir(tmp_path, "qwen2_vl"))
    model, processor = family.model, family.processor
    images, prompt = make_images(1), family.prompt("a", 1)
    for cache in (VisionEmbeddingCache(), new_cache(family, with_model=False)):
        with pytest.raises(ConfigurationError, match="namespace"):
            mlx_vlm.prepare_inputs_with_features(model, processor, images, prompt, cache=cache)
    cache = new_cache(family, with_model=False)
    processor.image_processor.min_pixels = 28 * 28 * 8  # changed after the cache was built
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
    images = make_images(1)
    prompt = "<|im_start|> user <|vision_start|><|image_pad|><|vision_end|> a <|im_end|>"
    for namespace in impostors:
        with pytest.raises(ConfigurationError, match="namespace"):
            mlx_vlm.prepare_inputs(
                processor, images=images, prompts=prompt, cache=VisionEmbeddingCache(namespace=namespace)
            )
    accepted = VisionEmbeddingCache(namespace=mlx_vlm.cache_namespace("org/model;rev=1", processor))
    mlx_vlm.prepare_inputs(processor, images=images, prompts=prompt, cache=accepted)


def test_unsupported_family_and_processor_raise_configuration_error() -> None:
    processor = build_random_processor("qwen2_vl")
    florence2 = SimpleNamespace(config=SimpleNamespace(model_type="florence2"))
    with pytest.raises(ConfigurationError, match="florence2"):
        mlx_vlm.cache_namespace("m", processor, florence2)
    with pytest.raises(ConfigurationError, match="florence2"):
        mlx_vlm.image_feature_encoder(florence2, processor, VisionEmbeddingCache())
    with pytest.raises(ConfigurationError, match="not supported"):
        mlx_vlm.cache_namespace("m", SimpleNamespace(image_processor=processor.image_processor))


def test_placeholder_count_must_match_images() -> None:
    processor = build_random_processor("qwen2_vl")
    cache = VisionEmbeddingCache(namespace=mlx_vlm.cache_namespace("m", processor))
    prompt = "user <|vision_start|><|image_pad|><|vision_end|> a"
    with pytest.raises(PlaceholderMismatchError, match="1 image placeholder"):
        mlx_vlm.prepare_inputs(processor, images=make_images(2), prompts=prompt, cache=cache)


def test_missing_mlx_vlm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    processor = build_random_processor("qwen2_vl")
    monkeypatch.setitem(sys.modules, "mlx_vlm.utils", None)  # makes `import mlx_vlm.utils` fail
    with pytest.raises(ImportError, match=r"visioncache\[mlx\]"):
        mlx_vlm.prepare_inputs(processor, images=make_images(1), prompts="a", cache=VisionEmbeddingCache())


def test_another_mlx_vlm_release_is_refused_with_both_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    processor = build_random_processor("qwen2_vl")
    real_version = metadata.version
    monkeypatch.setattr(
        metadata, "version", lambda name: "0.7.9" if name == "mlx-vlm" else real_version(name)
    )
    with pytest.raises(ConfigurationError, match=r"supports mlx-vlm ==0\.7\.10, but 0\.7\.9 is installed"):
        mlx_vlm.prepare_inputs(processor, images=make_images(1), prompts="a", cache=VisionEmbeddingCache())
