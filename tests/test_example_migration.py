"""examples/reference_engine_migration.py runs, keeps the logits, and step 2 skips the vision tower."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

mx = pytest.importorskip("mlx.core", reason="mlx cannot be imported here (pip install 'visioncache[mlx]')")
pytest.importorskip("mlx_vlm", reason="mlx-vlm cannot be imported here (pip install 'visioncache[mlx]')")

from PIL import Image

from visioncache import VisionEmbeddingCache
from visioncache.bench.mlx_random_model import build_random_model
from visioncache.bench.workload import question_prompt
from visioncache.integrations.mlx_vlm.adapter import cache_namespace
from visioncache.integrations.mlx_vlm.families import check_family, family_for

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "reference_engine_migration.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_engine_migration", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_every_step_gives_the_logits_of_the_uncached_engine(capsys: pytest.CaptureFixture[str]) -> None:
    results = load_example().main()
    assert set(results) == {"no cache", "step 1", "step 2"}
    for name in ("step 1", "step 2"):
        assert len(results[name]) == 2
        for ours, expected in zip(results[name], results["no cache"], strict=True):
            assert mx.array_equal(ours, expected).item(), name
    printed = capsys.readouterr().out
    assert printed.count("same logits as no cache: True") == 3
    assert "step 2: same logits as no cache: True" in printed
    assert printed.rstrip().endswith("images whose vision features were reused: 1")


@pytest.mark.slow
def test_step_2_second_request_with_the_same_image_skips_the_vision_tower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load_example()
    model, processor = build_random_model("qwen2_vl")
    check_family(family_for(model, processor), model, processor)  # its probe images, before counting
    tower_class = type(model.vision_tower)
    original = tower_class.__call__
    calls: list[int] = []

    def counting_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(tower_class, "__call__", counting_call)
    # The same image saved twice, as an engine saves each request's upload to a new temporary file.
    first, second = tmp_path / "request-1.png", tmp_path / "request-2.png"
    image = Image.effect_noise((56, 56), 64).convert("RGB")
    image.save(first)
    second.write_bytes(first.read_bytes())

    cache = VisionEmbeddingCache(namespace=cache_namespace(example.MODEL_NAME, processor, model))
    engine = example.VisionCacheEngine(model, processor, cache)
    reference = example.ReferenceEngine(model, processor, VisionEmbeddingCache(enabled=False))
    for path, prompt in ((first, question_prompt("describe the image")), (second, question_prompt("a cat"))):
        calls.clear()
        expected = reference.next_token_logits([str(path)], prompt)
        assert len(calls) == 1
        calls.clear()
        logits = engine.next_token_logits([str(path)], prompt)
        assert mx.array_equal(logits, expected).item()
        assert len(calls) == (1 if path == first else 0)
