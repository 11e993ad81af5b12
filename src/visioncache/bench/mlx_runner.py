"""The bench's mlx-vlm engine: the same workload and report as the transformers engine.

Why: MLX users (the reference module lives in an MLX engine) must see the same comparison. Each
mode is an `MlxPipeline` with its own cache; the modes take turns request by request so outside
load falls on all of them alike, and every request's last-position logits are compared with the
``off`` mode's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from visioncache.bench.mlx_pipeline import MlxPipeline
from visioncache.bench.report import ModeResult
from visioncache.bench.workload import MODES, Workload, chat_prompt

__all__ = ["run_modes"]


def run_modes(
    model: Any,
    processor: Any,
    workload: Workload,
    progress: Callable[[Iterable[Any], str], Iterable[Any]],
) -> tuple[list[ModeResult], float]:
    """Every mode on ``workload``: the results and the largest |logit difference| from ``off``."""
    pipelines = [MlxPipeline(model, processor, mode) for mode in MODES]
    pipelines[0].warm_up()
    results = [ModeResult(mode) for mode in MODES]
    max_diff = 0.0
    for request in progress(workload.requests, "requests"):
        prompt = chat_prompt(request)
        images = [workload.images[index] for index in request.image_indexes]
        reference: np.ndarray | None = None
        for pipeline, result in zip(pipelines, results, strict=True):
            outcome = pipeline.run_request(images, prompt)
            result.image_s.append(outcome.prepare_s)
            result.prefill_s.append(outcome.prepare_s + outcome.prefill_s)
            result.images_per_request.append(len(images))
            result.preprocess_s += outcome.preprocess_s
            result.encode_s += outcome.encode_s
            result.images_encoded += outcome.images_encoded
            if reference is None:
                reference = outcome.logits
            else:
                max_diff = max(max_diff, float(np.abs(outcome.logits - reference).max()))
    for pipeline, result in zip(pipelines, results, strict=True):
        result.wall_s = sum(result.prefill_s)
        result.images_sent = workload.images_sent
        result.stats = pipeline.stats()
    return results, max_diff
