"""The exactness self-check of a family on the loaded model, run before its values are served.

A family description says how cached values are built and fed; whether that gives exactly what
the model computes without the cache depends on the loaded model (its dtype, its kernels, the
mlx-vlm release). So on first use of a model, two probe images go three ways, compared bit for
bit:

1. each image encoded **alone**;
2. both encoded in **one** tower call (the batched misses of a scheduler step);
3. the model's **own uncached path**: ``mlx_vlm.utils.prepare_inputs`` and ``model(...)``,
   against the family's `feed` + `forward` of the values of 1.

If 3 differs from the family's logits, the family is refused with the reason (ConfigurationError).
If only 2 differs from 1, batching is not exact on this model: `Exactness.batched` is False and
misses are encoded one image per tower call. `kvcheck.split_prefill_exact` also says whether a
prompt prefilled as a cached prefix plus a tail gives the same logits (`Exactness.split_prefill`);
where it does not, an engine must not reuse KV across image prompts.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from visioncache import ConfigurationError, forking
from visioncache.integrations.mlx_vlm.families.base import Family, ImageValue
from visioncache.integrations.mlx_vlm.families.kvcheck import split_prefill_exact
from visioncache.integrations.mlx_vlm.imports import import_mlx
from visioncache.integrations.mlx_vlm.protocols import Model, Processor

__all__ = ["Exactness", "check_family", "probe_images"]

_PROBE_SIZES = ((48, 72), (72, 56))  # (height, width): two grids / tile layouts
_results: dict[tuple[int, int], Exactness] = {}
_lock = forking.lock()  # a leaf: the results only, never held while checking


@dataclass(frozen=True)
class Exactness:
    """What the self-check found on one model."""

    family: str
    batched: bool  # one tower call over several images gives each image's values as alone
    split_prefill: bool  # a prompt prefilled as a cached prefix + tail gives one prefill's logits


def probe_images() -> list[Any]:
    """Two small random RGB images of different sizes (the same every time)."""
    from PIL import Image

    rng = np.random.default_rng(20240521)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in _PROBE_SIZES]


def _same(first: Any, second: Any) -> bool:
    """Two value trees with the same keys and bit-identical arrays (dtype and shape included)."""
    mx = import_mlx()
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        return first.keys() == second.keys() and all(_same(first[key], second[key]) for key in first)
    if isinstance(first, list | tuple) and isinstance(second, list | tuple):
        return len(first) == len(second) and all(_same(a, b) for a, b in zip(first, second, strict=True))
    if isinstance(first, mx.array) and isinstance(second, mx.array):
        return first.dtype == second.dtype and bool(mx.array_equal(first, second).item())
    return bool(first == second)


def _uncached_logits(
    family: Family, model: Model, processor: Processor, images: list[Any], prompt: str
) -> Any:
    return family.uncached_forward(model, family.uncached_inputs(processor, images, prompt)).logits


def _cached_logits(
    family: Family, model: Model, processor: Processor, values: list[ImageValue], prompt: str
) -> Any:
    inputs = family.tokenize(processor, [prompt], values)
    feed = family.feed(model, inputs["input_ids"], family.hook_inputs(model, values))
    return family.forward(model, feed, mask=inputs["attention_mask"]).logits


def _run_check(family: Family, model: Model, processor: Processor) -> Exactness:
    mx = import_mlx()
    images = probe_images()
    entries = family.preprocess(processor, images)
    alone = [family.encode(model, [entry])[0] for entry in entries]
    batched = all(_same(a, b) for a, b in zip(alone, family.encode(model, entries), strict=True))
    marker = family.marker(processor)
    prompt = family.probe_prompt(marker)
    count = prompt.count(marker)
    expected = _uncached_logits(family, model, processor, images[:count], prompt)
    ours = _cached_logits(family, model, processor, alone[:count], prompt)
    if expected.shape != ours.shape or not bool(mx.array_equal(expected, ours).item()):
        difference = (
            float(mx.max(mx.abs(expected.astype(mx.float32) - ours.astype(mx.float32))).item())
            if expected.shape == ours.shape
            else f"shapes {tuple(expected.shape)} vs {tuple(ours.shape)}"
        )
        raise ConfigurationError(
            f"{family.name} ({model.config.model_type}): logits from cached vision features differ "
            f"from the model's own uncached forward on this model (max difference {difference}); "
            "visioncache refuses to serve cached features that would change the output"
        )
    return Exactness(family.name, batched, split_prefill_exact(family, model, processor, alone, marker))


def check_family(family: Family, model: Model, processor: Processor) -> Exactness:
    """The self-check's result for this model and processor, run once per pair (memoised while
    the model lives). Raises ConfigurationError when cached values would change the output."""
    key = (id(model), id(processor))
    with _lock:
        found = _results.get(key)
    if found is not None:
        return found
    result = _run_check(family, model, processor)
    with _lock:
        if key not in _results:
            _results[key] = result
            weakref.finalize(model, _results.pop, key, None)
    return result
