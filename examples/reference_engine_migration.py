"""Moving an mlx engine from the reference cache module to visioncache, in two small steps.

An engine written against ``vllm_mlx.vision_embedding_cache`` (as vllm-mlx is) wraps
``mlx_vlm.utils.prepare_inputs`` in ``get_pixel_cache`` / ``set_pixel_cache``, keyed by the images
and the whole chat-templated prompt; ``ReferenceEngine`` below is such an engine.

Step 1 changes the import and nothing else. The same calls now key images by their content (in
order, 256-bit digests; a file and a data URL of the same bytes agree) and are thread-safe::

    - from vllm_mlx.vision_embedding_cache import VisionEmbeddingCache
    + from visioncache import VisionEmbeddingCache

Step 2 gains the embedding level. The prompt-keyed entry misses on every new chat turn (the prompt
grew) and, even on a hit, the vision tower runs again. Caching each image's vision features
instead skips both on any later request with that image, whatever the prompt::

    - cache = VisionEmbeddingCache()
    + cache = VisionEmbeddingCache(namespace=cache_namespace(MODEL_NAME, processor, model))

      def prepare(self, images, prompt):
    -     entry = self.cache.get_pixel_cache(images, prompt)
    -     ...  (the body of ReferenceEngine.prepare)
    +     return prepare_inputs_with_features(self.model, self.processor, images, prompt,
    +                                         cache=self.cache)

The forward is unchanged: the returned inputs carry mlx-vlm's ``cached_image_features``.

Run: ``python examples/reference_engine_migration.py`` (a tiny random-weight Qwen2-VL on mlx).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_vlm.utils import prepare_inputs
from PIL import Image

from visioncache import VisionEmbeddingCache  # step 1: was vllm_mlx.vision_embedding_cache
from visioncache.bench.mlx_random_model import build_random_model
from visioncache.bench.workload import question_prompt
from visioncache.integrations.mlx_vlm.adapter import cache_namespace, prepare_inputs_with_features

MODEL_NAME = "random-weights-qwen2-vl-tiny"  # names the weights; a real engine: repo id + revision


class ReferenceEngine:
    """An engine as written against the reference module: a prompt-keyed pixel cache."""

    def __init__(self, model: Any, processor: Any, cache: VisionEmbeddingCache) -> None:
        self.model, self.processor, self.cache = model, processor, cache

    def prepare(self, images: list[str], prompt: str) -> dict[str, Any]:
        entry = self.cache.get_pixel_cache(images, prompt)
        if entry is not None:
            return {
                "input_ids": entry.input_ids,
                "attention_mask": entry.attention_mask,
                "pixel_values": entry.pixel_values,
                "image_grid_thw": entry.image_grid_thw,
            }
        start = time.perf_counter()
        inputs = prepare_inputs(self.processor, images=images, prompts=[prompt])  # type: ignore[no-untyped-call]
        self.cache.set_pixel_cache(
            images,
            prompt,
            inputs["pixel_values"],
            inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            image_grid_thw=inputs["image_grid_thw"],
            processing_time=time.perf_counter() - start,
        )
        return dict(inputs)

    def next_token_logits(self, images: list[str], prompt: str) -> mx.array:
        """The prefill's last-position logits (the engine would sample from them)."""
        inputs = self.prepare(images, prompt)
        extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
        output = self.model(
            inputs["input_ids"], inputs["pixel_values"], mask=inputs["attention_mask"], **extra
        )
        logits: mx.array = output.logits[0, -1]
        mx.eval(logits)
        return logits


class VisionCacheEngine(ReferenceEngine):
    """Step 2: the same engine with per-image vision features cached."""

    def prepare(self, images: list[str], prompt: str) -> dict[str, Any]:
        return prepare_inputs_with_features(self.model, self.processor, images, prompt, cache=self.cache)


def main() -> dict[str, list[mx.array]]:
    """Two chat turns about one image through each engine; returns each engine's logits."""
    model, processor = build_random_model("qwen2_vl")
    engines = {
        "no cache": ReferenceEngine(model, processor, VisionEmbeddingCache(enabled=False)),
        "step 1": ReferenceEngine(model, processor, VisionEmbeddingCache()),
        "step 2": VisionCacheEngine(
            model, processor, VisionEmbeddingCache(namespace=cache_namespace(MODEL_NAME, processor, model))
        ),
    }
    first_turn = question_prompt("describe the image")
    second_turn = f"{first_turn} a cat <|im_end|> {question_prompt('what is in this picture', 0)}"
    results: dict[str, list[mx.array]] = {}
    with tempfile.TemporaryDirectory() as folder:
        # vllm-mlx saves request images to temporary files and passes their paths.
        path = Path(folder) / "photo.png"
        pixels = np.random.default_rng(0).integers(0, 256, (56, 84, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
        for name, engine in engines.items():
            results[name] = [
                engine.next_token_logits([str(path)], turn) for turn in (first_turn, second_turn)
            ]
            stats = engine.cache.get_stats()
            pairs = zip(results[name], results["no cache"], strict=True)
            same = all(mx.array_equal(ours, expected).item() for ours, expected in pairs)
            print(
                f"{name:>8}: same logits as no cache: {same}; prompt-keyed hits: "
                f"{stats['pixel_cache_hits']}; images whose vision features were reused: "
                f"{stats['embedding_cache_hits']}"
            )
    return results


if __name__ == "__main__":
    main()
