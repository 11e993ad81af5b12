"""One chat request through mlx-vlm in each bench mode: preprocessing, vision encoding, prefill.

Why: ``visioncache bench --engine mlx`` compares the same three input paths as the transformers
engine, on the same workload; the modes differ only in how a request's model inputs are built,
and every mode ends in the same prefill, so their logits must agree and their times compare.

- ``off``: mlx-vlm's own path: ``mlx_vlm.utils.prepare_inputs`` (images + text), then the vision
  tower on every image.
- ``prompt_keyed``: the reference engine (vllm-mlx): processor output cached under the images and
  the whole prompt (``get_pixel_cache`` / ``set_pixel_cache``); the tower always runs.
- ``visioncache``: per-image pixel-only and embedding levels; only images never seen before are
  preprocessed and encoded, in one tower call.

The tower's time is measured on its own: its output goes to the model through mlx-vlm's
``cached_image_features`` hook, which gives the same logits as ``pixel_values`` (tests prove it).

API for the bench::

    model, processor = build_random_model("qwen2_vl", "tiny" | "full", dtype="float32")
    pipeline = MlxPipeline(model, processor, mode, cache_options={})  # mode in workload.MODES
    pipeline.warm_up()                                  # untimed; pays one-time allocations
    result = pipeline.run_request(images, prompt)       # a RequestResult
    pipeline.stats()                                    # the cache's snapshot(), None for "off"

``prompt`` holds one ``vocabulary.IMAGE_PLACEHOLDER`` per image (``workload.chat_prompt(request)``);
images are any visioncache image input (the workload's ``data:`` URLs).
A ``ModeResult`` is filled per request with ``prepare_s.append(result.prepare_s)``,
``prefill_s.append(result.prepare_s + result.prefill_s)``, and per mode with the sums of
``preprocess_s``, ``encode_s`` and ``images_encoded``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from visioncache.bench.mlx_random_model import build_random_model
from visioncache.bench.workload import MODES, question_prompt
from visioncache.cache import VisionEmbeddingCache
from visioncache.entries import PixelOnlyCacheEntry
from visioncache.errors import ConfigurationError
from visioncache.integrations.mlx_vlm.adapter import cache_namespace, inputs_from_features
from visioncache.integrations.mlx_vlm.families import family_for
from visioncache.integrations.mlx_vlm.families.qwen import Qwen2VL
from visioncache.integrations.mlx_vlm.imports import import_mlx, import_mlx_vlm_utils
from visioncache.stats import CacheStats

__all__ = ["MlxPipeline", "RequestResult", "build_random_model"]


@dataclass
class RequestResult:
    """What one request cost in one mode, and its prefill's last-position logits."""

    preprocess_s: float = 0.0  # image decoding + processor (and, off/prompt_keyed, the lookup)
    encode_s: float = 0.0  # vision tower
    prepare_s: float = 0.0  # all input building: lookups, preprocessing, encoding, tokenising
    prefill_s: float = 0.0  # the model's forward, from inputs to evaluated logits
    images_preprocessed: int = 0
    images_encoded: int = 0
    logits: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # (vocab,) fp32


class MlxPipeline:
    """A model and processor serving requests in one bench mode (with its own cache)."""

    def __init__(
        self,
        model: Any,
        processor: Any,
        mode: str,
        cache_options: dict[str, Any] | None = None,
        model_name: str = "random-weights",
    ) -> None:
        if mode not in MODES:
            raise ConfigurationError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.model, self.processor, self.mode = model, processor, mode
        family = family_for(model, processor)
        if not isinstance(family, Qwen2VL):
            raise ConfigurationError(f"the mlx bench runs Qwen-VL models, got {family.name}")
        self.family = family
        self.cache = (
            None
            if mode == "off"
            else VisionEmbeddingCache(
                namespace=cache_namespace(model_name, processor, model), **(cache_options or {})
            )
        )

    def stats(self) -> CacheStats | None:
        return self.cache.snapshot() if self.cache is not None else None

    def warm_up(self) -> None:
        """One small uncached request: the first forward pays one-time allocation costs."""
        image = Image.new("RGB", (56, 56), (120, 80, 40))
        inputs, _ = self._mlx_vlm_inputs([image], question_prompt("describe the image"), None)
        self._prefill(inputs)

    def run_request(self, images: Sequence[Any], prompt: str) -> RequestResult:
        """Build the inputs in this pipeline's mode, then prefill; everything evaluated and timed."""
        start = time.perf_counter()
        if self.mode == "visioncache" and images:
            inputs, result = self._visioncache_inputs(list(images), prompt)
        else:
            inputs, result = self._mlx_vlm_inputs(list(images), prompt, self.cache)
        prefill_start = time.perf_counter()
        result.prepare_s = prefill_start - start
        result.logits = self._prefill(inputs)
        result.prefill_s = time.perf_counter() - prefill_start
        return result

    def _mlx_vlm_inputs(
        self, images: list[Any], prompt: str, cache: VisionEmbeddingCache | None
    ) -> tuple[dict[str, Any], RequestResult]:
        """The off and prompt_keyed paths: mlx-vlm's prepare_inputs, then the tower on every image."""
        utils, mx = import_mlx_vlm_utils(), import_mlx()
        result = RequestResult()
        start = time.perf_counter()
        entry = cache.get_pixel_cache(images, prompt) if cache is not None and images else None
        if entry is not None:
            inputs = {
                "input_ids": entry.input_ids,
                "attention_mask": entry.attention_mask,
                "pixel_values": entry.pixel_values,
                "image_grid_thw": entry.image_grid_thw,
            }
        else:
            inputs = dict(utils.prepare_inputs(self.processor, images=images or None, prompts=[prompt]))
            result.images_preprocessed = len(images)
            if cache is not None and images:
                cache.set_pixel_cache(
                    images,
                    prompt,
                    inputs["pixel_values"],
                    inputs["input_ids"],
                    attention_mask=inputs["attention_mask"],
                    image_grid_thw=inputs["image_grid_thw"],
                    processing_time=time.perf_counter() - start,
                )
        encode_start = time.perf_counter()
        result.preprocess_s = encode_start - start
        if images:
            pixels = inputs["pixel_values"].astype(self.family.tower_dtype(self.model))
            features, _ = self.family.run_tower(self.model, pixels, inputs["image_grid_thw"])
            mx.eval(features)
            inputs["cached_image_features"] = features
            result.encode_s = time.perf_counter() - encode_start
            result.images_encoded = len(images)
        return inputs, result

    def _visioncache_inputs(self, images: list[Any], prompt: str) -> tuple[dict[str, Any], RequestResult]:
        """``prepare_inputs_with_features``, built from its parts so each stage's work is timed."""
        assert self.cache is not None
        cache, result = self.cache, RequestResult()

        def preprocess(missing: list[Any]) -> list[PixelOnlyCacheEntry]:
            start = time.perf_counter()
            entries = self.family.preprocess(self.processor, missing)
            result.preprocess_s += time.perf_counter() - start
            result.images_preprocessed += len(missing)
            return entries

        def encode(missing: list[Any]) -> list[dict[str, Any]]:
            entries = cache.preprocess_images(missing, preprocess)
            start = time.perf_counter()
            values = self.family.encode(self.model, entries)
            result.encode_s += time.perf_counter() - start
            result.images_encoded += len(missing)
            return values

        values = cache.encode_images(images, encode, expect=self.family.fits(self.model))
        return inputs_from_features(self.model, self.processor, values, prompt), result

    def _prefill(self, inputs: dict[str, Any]) -> np.ndarray:
        mx = import_mlx()
        extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
        output = self.model(
            inputs["input_ids"], inputs.get("pixel_values"), mask=inputs["attention_mask"], **extra
        )
        last = output.logits[0, -1, :].astype(mx.float32)
        mx.eval(last)
        return np.array(last)
