"""visioncache.bench.mlx_pipeline: the bench's three modes agree on logits and differ in work."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("mlx.core", reason="mlx cannot be imported here (pip install 'visioncache[mlx]')")
pytest.importorskip("mlx_vlm", reason="mlx-vlm cannot be imported here (pip install 'visioncache[mlx]')")

from visioncache import ConfigurationError
from visioncache.bench.mlx_pipeline import MlxPipeline, RequestResult, build_random_model
from visioncache.bench.vocabulary import IMAGE_PLACEHOLDER
from visioncache.bench.workload import MODES


def conversation() -> list[tuple[list[Image.Image], str]]:
    """Three requests of one chat: turn 2 resends image a with a longer prompt, turn 3 adds b."""
    rng = np.random.default_rng(5)
    a, b = (Image.fromarray(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)) for _ in range(2))

    def turn(user: str, answer: str | None = None) -> str:
        reply = f" {answer} <|im_end|>" if answer else ""
        return f"<|im_start|> user {user} <|im_end|> <|im_start|> assistant{reply}"

    first = turn(f"{IMAGE_PLACEHOLDER} describe the image")
    second = f"{turn(f'{IMAGE_PLACEHOLDER} describe the image', 'a cat')} {turn('what is in this picture')}"
    third = f"{second} a dog <|im_end|> {turn(f'{IMAGE_PLACEHOLDER} compare')}"
    return [([a], first), ([a], second), ([a, b], third)]


@pytest.mark.slow
def test_modes_give_identical_logits_and_visioncache_encodes_each_image_once() -> None:
    model, processor = build_random_model("qwen2_vl")
    results: dict[str, list[RequestResult]] = {}
    for mode in MODES:
        pipeline = MlxPipeline(model, processor, mode)
        pipeline.warm_up()
        results[mode] = [pipeline.run_request(images, prompt) for images, prompt in conversation()]
        stats = pipeline.stats()
        assert (stats is None) == (mode == "off")
    for mode in MODES:
        for result, expected in zip(results[mode], results["off"], strict=True):
            assert result.logits.dtype == np.float32 and result.logits.shape == (model.config.vocab_size,)
            np.testing.assert_array_equal(result.logits, expected.logits)
            assert result.prepare_s > 0 and result.prefill_s > 0
    assert [r.images_encoded for r in results["off"]] == [1, 1, 2]
    assert [r.images_encoded for r in results["prompt_keyed"]] == [1, 1, 2]  # the prompt grew
    assert [r.images_encoded for r in results["visioncache"]] == [1, 0, 1]
    assert [r.images_preprocessed for r in results["visioncache"]] == [1, 0, 1]
    assert results["visioncache"][1].encode_s == 0.0 and results["visioncache"][1].preprocess_s == 0.0


def test_unknown_mode_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="mode"):
        MlxPipeline(None, None, "fast")
