"""The bench's transformers engine: one workload through three input paths, timed per request.

Why: the three modes must differ only in how a request's model inputs are built, so each mode is
a ``prepare`` function and one loop times them all the same way and runs the same prefill.
``off`` is transformers' own path (``model(**processor(text=..., images=...))``: the vision tower
runs inside the forward on every image); ``prompt_keyed`` is the reference engine's (processor
output cached under images + the whole prompt; the vision tower always runs); ``visioncache`` is
``CachedVisionModel``. Any described family runs the same way; the vision tower's time is
measured on the tower module itself, wherever it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from PIL import Image
from transformers import PreTrainedModel, ProcessorMixin

from visioncache import VisionEmbeddingCache
from visioncache.bench.report import ModeResult
from visioncache.bench.tower_clock import TowerClock
from visioncache.bench.vocabulary import IMAGE_PLACEHOLDER
from visioncache.bench.workload import MODES, Workload, chat_prompt, question_prompt
from visioncache.integrations.transformers import CachedVisionModel, StageTimes, model_namespace
from visioncache.integrations.transformers.images import ImageInput, load_pil_image

__all__ = ["run_modes"]

# (prompt, images) -> (model inputs, seconds spent on the images before the forward)
Prepare = Callable[[str, list[ImageInput]], tuple[dict[str, Any], float]]


class _Engine:
    """A model and its processor, with each mode's way of building a request's inputs."""

    def __init__(self, model: PreTrainedModel, processor: ProcessorMixin, placeholder: str) -> None:
        self.model: Any = model
        self.processor: Any = processor
        self.placeholder = placeholder
        self.namespace = model_namespace(model, processor)
        self.tower = TowerClock(model)

    def _processor_inputs(
        self, prompt: str, images: list[ImageInput], times: StageTimes, cache: VisionEmbeddingCache | None
    ) -> tuple[dict[str, Any], float]:
        """transformers' path, optionally with the reference's prompt-keyed pixel cache; its
        image seconds include the text's tokenisation, which runs inside the processor. The
        tower runs in the forward, on every image."""
        start = time.perf_counter()
        entry = cache.get_pixel_cache(images, prompt) if cache is not None else None
        if entry is None:
            pictures = [[load_pil_image(image) for image in images]] if images else None
            inputs = dict(self.processor(images=pictures, text=[prompt], return_tensors="pt"))
            if cache is not None:
                named = ("pixel_values", "input_ids", "attention_mask", "image_grid_thw")
                cache.set_pixel_cache(
                    images,
                    prompt,
                    inputs.get("pixel_values"),
                    inputs["input_ids"],
                    attention_mask=inputs["attention_mask"],
                    image_grid_thw=inputs.get("image_grid_thw"),
                    extra_kwargs={name: value for name, value in inputs.items() if name not in named},
                    processing_time=time.perf_counter() - start,
                )
        else:
            inputs = {
                "input_ids": entry.input_ids,
                "attention_mask": entry.attention_mask,
                **({"pixel_values": entry.pixel_values} if entry.pixel_values is not None else {}),
                **({"image_grid_thw": entry.image_grid_thw} if entry.image_grid_thw is not None else {}),
                **entry.extra_kwargs,
            }
        elapsed = time.perf_counter() - start
        times.add(preprocess=elapsed, preprocessed=0 if entry is not None else len(images))
        times.add(encoded=len(images))  # in the forward; its seconds come from the tower's clock
        device = self.model.device
        placed = {
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in inputs.items()
        }
        return placed, elapsed

    def preparer(self, mode: str, cache: VisionEmbeddingCache | None) -> tuple[Prepare, StageTimes]:
        """``mode``'s input-building function and the counters it adds its work to."""
        if mode == "visioncache":
            adapter = CachedVisionModel(self.model, self.processor, cache=cache)

            def prepare(prompt: str, images: list[ImageInput]) -> tuple[dict[str, Any], float]:
                start = time.perf_counter()
                values = adapter.image_outputs([[images]])  # one list for the prompt, as `off`
                image_seconds = time.perf_counter() - start
                return adapter.model_inputs([prompt], values), image_seconds

            return prepare, adapter.times
        times = StageTimes()
        return (lambda prompt, images: self._processor_inputs(prompt, images, times, cache), times)

    def prefill_logits(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, float]:
        """The prefill's logits, and the seconds the vision tower ran inside it."""
        with self.tower.timing() as tower, torch.no_grad():
            logits: torch.Tensor = self.model(**inputs).logits.float()
            _synchronize(logits.device)
        return logits, tower.seconds

    def warm_up(self) -> None:
        """One small request, untimed: the first forward pays one-time allocation costs."""
        image = Image.new("RGB", (56, 56), (120, 80, 40))
        prompt = question_prompt("describe", 1, self.placeholder)
        self.prefill_logits(self._processor_inputs(prompt, [image], StageTimes(), None)[0])


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so wall-clock timings cover it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _ModeRun:
    """One mode's cache, input path and measurements while the workload runs."""

    def __init__(self, engine: _Engine, mode: str) -> None:
        self.engine = engine
        self.cache = None if mode == "off" else VisionEmbeddingCache(namespace=engine.namespace)
        self.prepare, self.times = engine.preparer(mode, self.cache)
        self.result = ModeResult(mode)

    def run(self, prompt: str, images: list[ImageInput]) -> torch.Tensor:
        """One request's prefill logits, timed."""
        start = time.perf_counter()
        inputs, image_seconds = self.prepare(prompt, images)
        logits, tower_seconds = self.engine.prefill_logits(inputs)
        self.times.add(encode=tower_seconds)
        self.result.prefill_s.append(time.perf_counter() - start)
        self.result.image_s.append(image_seconds + tower_seconds)
        self.result.images_per_request.append(len(images))
        return logits

    def finish(self, workload: Workload) -> ModeResult:
        result, times = self.result, self.times
        result.wall_s = sum(result.prefill_s)
        result.preprocess_s, result.encode_s = times.preprocess_seconds, times.encode_seconds
        result.images_encoded, result.images_sent = times.images_encoded, workload.images_sent
        result.stats = self.cache.snapshot() if self.cache is not None else None
        return result


def run_modes(
    model: PreTrainedModel,
    processor: ProcessorMixin,
    workload: Workload,
    progress: Callable[[Iterable[Any], str], Iterable[Any]],
    placeholder: str = IMAGE_PLACEHOLDER,
) -> tuple[list[ModeResult], float]:
    """Every mode on ``workload``; returns the results and the largest absolute difference of any
    request's prefill logits from the ``off`` mode's. ``placeholder`` is the text a prompt holds
    per image (the family's chat-template placeholder).

    The modes take turns request by request (each with its own cache), so load from other
    processes on a shared machine falls on all of them alike instead of on whichever ran last.
    """
    engine = _Engine(model, processor, placeholder)
    engine.warm_up()
    runs = [_ModeRun(engine, mode) for mode in MODES]
    max_diff = 0.0
    for request in progress(workload.requests, "requests"):
        prompt = chat_prompt(request, placeholder)
        images: list[ImageInput] = [workload.images[i] for i in request.image_indexes]
        reference, *others = (run.run(prompt, images) for run in runs)
        for logits in others:
            max_diff = max(max_diff, (logits - reference).abs().max().item())
    return [run.finish(workload) for run in runs], max_diff
