"""CachedVisionModel gives transformers' own outputs with the cache disabled, cold and warm."""

from __future__ import annotations

import base64
import importlib
import io
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from PIL import Image

from visioncache import VisionEmbeddingCache
from visioncache.bench.models import build_offline_model
from visioncache.errors import ConfigurationError
from visioncache.integrations.transformers import (
    CachedVisionModel,
    PlaceholderMismatchError,
    model_namespace,
)

pytestmark = pytest.mark.slow

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def prompt(images: int, question: str = "describe the image") -> str:
    """A one-turn ChatML prompt with ``images`` image placeholders."""
    return f"<|im_start|>user\n{PLACEHOLDER * images}{question}<|im_end|>\n<|im_start|>assistant\n"


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def reference_logits(model: Any, processor: Any, text: str | list[str], images: list[Image.Image]) -> Any:
    """transformers' own path: the processor on images + text, the model on pixel values."""
    inputs = processor(
        images=images, text=[text] if isinstance(text, str) else text, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        return model(**inputs).logits


def logits(model: Any, inputs: dict[str, Any]) -> Any:
    with torch.no_grad():
        return model(**inputs).logits


def assert_same_up_to_batching(actual: Any, expected: Any) -> None:
    """Equal up to float32 rounding. Where the cache encodes a request's misses in a different
    batch than transformers encodes the whole request, the vision tower's matmuls round
    differently (~1e-7); an image in the wrong place or order shifts logits by ~1e-1."""
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


def test_logits_match_with_cache_disabled_cold_and_warm(family_model: Any, images: Any) -> None:
    _, model, processor = family_model
    text, request = prompt(2), images[:2]
    expected = reference_logits(model, processor, text, request)
    disabled = CachedVisionModel(model, processor, cache=VisionEmbeddingCache(enabled=False))
    cached = CachedVisionModel(model, processor)

    assert torch.equal(logits(model, disabled.prepare(text, request)), expected)
    assert torch.equal(logits(model, cached.prepare(text, request)), expected)  # cold
    assert cached.times.images_encoded == 2
    assert torch.equal(logits(model, cached.prepare(text, request)), expected)  # warm
    # An embedding hit skips the vision tower and the image processor.
    assert (cached.times.images_encoded, cached.times.images_preprocessed) == (2, 2)
    assert cached.cache.get_stats()["embedding_cache_hits"] == 2


def test_greedy_generation_matches_cold_and_warm(family_model: Any, images: Any) -> None:
    _, model, processor = family_model
    text, request = prompt(2, "what is in this picture"), [images[2], images[0]]
    reference = processor(images=request, text=[text], return_tensors="pt")
    settings: dict[str, Any] = {"max_new_tokens": 6, "do_sample": False}
    expected = model.generate(**reference, **settings)
    cached = CachedVisionModel(model, processor)
    cold = model.generate(**cached.prepare(text, request), **settings)
    warm = model.generate(**cached.prepare(text, request), **settings)
    assert expected.shape[1] == reference["input_ids"].shape[1] + 6
    assert torch.equal(cold, expected)
    assert torch.equal(warm, expected)
    assert cached.times.images_encoded == 2


def test_multi_image_prompt_with_some_hits_encodes_only_misses(family_model: Any, images: Any) -> None:
    _, model, processor = family_model
    cached = CachedVisionModel(model, processor)
    cached.prepare(prompt(1), [images[1]])
    request = [images[0], images[1], images[3]]  # the hit sits between two misses
    inputs = cached.prepare(prompt(3), request)
    assert cached.times.images_encoded == 3  # 1 earlier + the 2 misses, in one call
    assert_same_up_to_batching(logits(model, inputs), reference_logits(model, processor, prompt(3), request))


def test_same_image_at_a_different_position(family_model: Any, images: Any) -> None:
    _, model, processor = family_model
    cached = CachedVisionModel(model, processor)
    cached.prepare(prompt(2), [images[0], images[1]])
    for request in ([images[1], images[0]], [images[2], images[0]], [images[0], images[0]]):
        inputs = cached.prepare(prompt(2, "compare the first and second"), request)
        expected = reference_logits(model, processor, prompt(2, "compare the first and second"), request)
        assert_same_up_to_batching(logits(model, inputs), expected)
    assert cached.times.images_encoded == 3  # images 0 and 1 once each, then image 2


def test_batch_of_requests_encodes_shared_images_once(family_model: Any, images: Any) -> None:
    _, model, processor = family_model
    cached = CachedVisionModel(model, processor)
    texts = [prompt(2, "describe the image"), prompt(1, "what is in this picture")]
    inputs = cached.prepare_batch([(texts[0], [images[0], images[1]]), (texts[1], [images[1]])])
    assert cached.times.images_encoded == 2
    expected = reference_logits(model, processor, texts, [images[0], images[1], images[1]])
    assert torch.equal(logits(model, inputs), expected)


def test_an_image_as_bytes_path_or_data_url_is_encoded_once(tmp_path: Path, images: Any) -> None:
    model, processor = build_offline_model("qwen2_vl")
    encoded = png_bytes(images[3])
    path = tmp_path / "image.png"
    path.write_bytes(encoded)
    data_url = "data:image/png;base64," + base64.b64encode(encoded).decode()
    cached = CachedVisionModel(model, processor)
    expected = reference_logits(model, processor, prompt(1), [images[3]])
    for image in (encoded, path, str(path), data_url):
        assert torch.equal(logits(model, cached.prepare(prompt(1), [image])), expected)
    assert cached.times.images_encoded == 1


def test_placeholder_mismatch_raises_before_touching_the_cache(images: Any) -> None:
    model, processor = build_offline_model("qwen2_vl")
    cached = CachedVisionModel(model, processor)
    with pytest.raises(PlaceholderMismatchError, match=r"1 <\|image_pad\|> placeholders but 2"):
        cached.prepare(prompt(1), images[:2])
    assert cached.cache.get_stats()["embedding_cache_misses"] == 0
    assert cached.times.images_encoded == 0


def test_namespace_separates_models_and_processors() -> None:
    model, processor = build_offline_model("qwen2_vl")
    namespace = model_namespace(model, processor)
    assert namespace == model_namespace(model, processor)
    assert CachedVisionModel(model, processor).cache.namespace == namespace
    other_family = model_namespace(*build_offline_model("qwen2_5_vl"))
    other_weights = model_namespace(*build_offline_model("qwen2_vl", seed=1))
    model_bf16, processor_bf16 = build_offline_model("qwen2_vl", dtype=torch.bfloat16)
    processor.image_processor.size = {"shortest_edge": 3136, "longest_edge": 28 * 28 * 64}
    other_processor = model_namespace(model, processor)
    namespaces = {
        namespace,
        other_family,
        other_weights,
        model_namespace(model_bf16, processor_bf16),
        other_processor,
    }
    assert len(namespaces) == 5


def test_user_namespace_overrides_the_derived_one() -> None:
    model, processor = build_offline_model("qwen2_vl")
    assert CachedVisionModel(model, processor, namespace="mine").cache.namespace == "mine"
    with pytest.raises(ConfigurationError, match="namespace"):
        CachedVisionModel(model, processor, cache=VisionEmbeddingCache(), namespace="mine")


def test_unsupported_family_is_a_configuration_error() -> None:
    llava = SimpleNamespace(config=SimpleNamespace(model_type="llava"))
    with pytest.raises(ConfigurationError, match=r"'llava' is not supported.*qwen2_vl"):
        CachedVisionModel(llava, SimpleNamespace())  # type: ignore[arg-type]


def test_missing_hf_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers.modeling_outputs", None)
    for name in [name for name in sys.modules if name.startswith("visioncache.integrations.transformers")]:
        monkeypatch.delitem(sys.modules, name)  # imported again, through the face that guards it
    with pytest.raises(ImportError, match=r"pip install 'visioncache\[hf\]'"):
        importlib.import_module("visioncache.integrations.transformers.adapter")
