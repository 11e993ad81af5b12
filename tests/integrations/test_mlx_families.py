"""The family descriptions' self-check on loaded models, and Qwen3-VL's deepstack features.

The self-check (`visioncache.integrations.mlx_vlm.families.selfcheck`) must refuse a family whose
cached values would change the logits, and fall back to one tower call per image when only
batching is inexact; a name alone never makes a family supported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

mx = pytest.importorskip("mlx.core", reason="mlx cannot be imported here (pip install 'visioncache[mlx]')")
pytest.importorskip("mlx_vlm", reason="mlx-vlm cannot be imported here (pip install 'visioncache[mlx]')")

from mlx_vlm import utils as mlx_vlm_utils

from tests.support.mlx_model_dir import save_model_dir
from tests.support.mlx_towers import tower_class
from visioncache import ConfigurationError, VisionEmbeddingCache
from visioncache.integrations import mlx_vlm
from visioncache.integrations.mlx_vlm.families import check_family, family_for
from visioncache.integrations.mlx_vlm.families.qwen import Qwen2VL, Qwen3VL

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {name: save_model_dir(root / name, name) for name in ("qwen2_vl", "qwen3_vl", "qwen3_5")}


def fresh(path: Path) -> tuple[Any, Any]:
    """A newly loaded model and processor (the self-check runs once per loaded model)."""
    model, processor = mlx_vlm_utils.load(str(path))
    return model, processor


def images(count: int) -> list[Image.Image]:
    rng = np.random.default_rng(7)
    return [Image.fromarray(rng.integers(0, 256, (56, 56 + 28 * i, 3), dtype=np.uint8)) for i in range(count)]


class HookOnlyQwen3VL(Qwen3VL):
    """Qwen3-VL fed as mlx-vlm's ``cached_image_features`` hook feeds it: no deepstack features."""

    def feed(self, model: Any, input_ids: Any, hook: Any) -> Any:
        hook = {name: value for name, value in hook.items() if name != "deepstack_visual_embeds"}
        return super().feed(model, input_ids, hook)


class BatchSensitive(Qwen2VL):
    """A tower whose batched output differs from each image alone (as padding across a batch does)."""

    def encode(self, model: Any, entries: Any) -> Any:
        values = super().encode(model, entries)
        if len(entries) > 1:
            for value in values:
                value["image_features"] = value["image_features"] + 1e-3
        return values


def test_a_family_whose_cached_logits_differ_is_refused_with_the_reason(model_dirs: dict[str, Path]) -> None:
    model, processor = fresh(model_dirs["qwen3_vl"])
    with pytest.raises(ConfigurationError, match=r"qwen3_vl.*differ from the model's own uncached forward"):
        check_family(HookOnlyQwen3VL(), model, processor)
    assert check_family(family_for(model, processor), model, processor).batched


def test_inexact_batching_encodes_misses_one_image_per_tower_call(
    model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from visioncache.integrations.mlx_vlm.families import registry

    model, processor = fresh(model_dirs["qwen2_vl"])
    family = BatchSensitive()
    monkeypatch.setitem(registry._BY_MODEL_TYPE, "qwen2_vl", family)
    monkeypatch.setitem(registry._BY_PROCESSOR, "Qwen2VLProcessor", family)
    exactness = check_family(family, model, processor)
    assert not exactness.batched
    cache = VisionEmbeddingCache(namespace=mlx_vlm.cache_namespace("m", processor, model))
    marker = family.marker(processor)
    prompt = f"user {marker} {marker} {marker} describe"
    baseline = dict(mlx_vlm_utils.prepare_inputs(processor, images=images(3), prompts=[prompt]))
    ids, pixels, mask = (baseline.pop(name) for name in ("input_ids", "pixel_values", "attention_mask"))
    expected = model(ids, pixels, mask=mask, **baseline).logits
    tower, count = tower_class("qwen2_vl")
    calls: list[int] = []
    original = tower.__call__
    monkeypatch.setattr(
        tower, "__call__", lambda self, *a, **k: calls.append(count(*a[:2])) or original(self, *a, **k)
    )
    inputs = mlx_vlm.prepare_inputs_with_features(model, processor, images(3), prompt, cache=cache)
    assert calls == [1, 1, 1]  # three misses, one tower call each: the batched values were not exact
    assert mx.array_equal(mlx_vlm.forward(model, inputs).logits, expected).item()


def test_qwen3_vl_deepstack_features_are_cached_and_fed(model_dirs: dict[str, Path]) -> None:
    """mlx-vlm's hook drops the deepstack features: through it, a hit would change the logits."""
    model, processor = fresh(model_dirs["qwen3_vl"])
    family = family_for(model, processor)
    marker = family.marker(processor)
    prompt = f"user {marker} and {marker} compare"
    baseline = dict(mlx_vlm_utils.prepare_inputs(processor, images=images(2), prompts=[prompt]))
    ids, pixels, mask = (baseline.pop(name) for name in ("input_ids", "pixel_values", "attention_mask"))
    expected = model(ids, pixels, mask=mask, **baseline).logits
    cache = VisionEmbeddingCache(namespace=mlx_vlm.cache_namespace("m", processor, model))
    for label in ("cold", "warm"):
        inputs = mlx_vlm.prepare_inputs_with_features(model, processor, images(2), prompt, cache=cache)
        assert mx.array_equal(mlx_vlm.forward(model, inputs).logits, expected).item(), label
        hook_only = {name: value for name, value in inputs.items() if name != "deepstack_visual_embeds"}
        ids, pixels, mask = (hook_only.pop(name) for name in ("input_ids", "pixel_values", "attention_mask"))
        assert not mx.array_equal(model(ids, pixels, mask=mask, **hook_only).logits, expected).item(), label
    layers = len(model.config.vision_config.deepstack_visual_indexes)
    for value in cache.get_image_embeddings(images(2)):
        rows, hidden = value["image_features"].shape
        assert value["deepstack_features"].shape == (layers, rows, hidden)


@pytest.mark.parametrize(("family", "exact"), [("qwen2_vl", True), ("qwen3_vl", True), ("qwen3_5", False)])
def test_the_split_prefill_probe_tells_where_kv_reuse_would_change_the_logits(
    model_dirs: dict[str, Path], family: str, exact: bool
) -> None:
    """Attention layers give the same logits prefilled in two parts as in one (so KV reuse is
    exact); Qwen3.5's gated-delta layers do not, text alone included, and the self-check says so."""
    from mlx_vlm.models.cache import make_prompt_cache

    model, processor = fresh(model_dirs[family])
    assert check_family(family_for(model, processor), model, processor).split_prefill is exact
    language_model = model.language_model
    language_model._position_ids = language_model._rope_deltas = None  # M-RoPE state of the last prompt
    ids = mx.array([list(range(10, 90))])
    whole = language_model(ids, cache=make_prompt_cache(language_model)).logits[:, -1]
    cache = make_prompt_cache(language_model)
    language_model(ids[:, :40], cache=cache)
    tail = language_model(ids[:, 40:], cache=cache).logits[:, -1]
    assert mx.array_equal(whole, tail).item() is exact
