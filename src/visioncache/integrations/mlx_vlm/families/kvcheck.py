"""Whether a prompt prefilled in two parts gives the logits of one prefill, on the loaded model.

An engine reusing KV (vllm-mlx's prefix cache, keyed by visioncache's image-aware ids) prefills a
chat turn as the cached state of the previous turn's prompt plus a tail: the tail is fed the
family's `Family.window` of the full prompt's inputs at the full prompt's positions. That equals a
single prefill only if the model's layers give the same numbers in two steps as in one: true of
attention layers on mlx-cpu, not always of recurrent ones (Qwen3.5's gated-delta layers, whose
chunked state update depends on where the chunks start). `split_prefill_exact` runs both ways on
the self-check's probe images, split three ways (the tail holding the second image, the only
image, or text alone), each the family allows (`Family.reusable_prefix`: Gemma 4 allows no
image in a tail past its sliding window), and compares the last logits bit for bit; where they
differ, or where the family allows none, KV reuse would change the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from visioncache import PlaceholderMismatchError
from visioncache.integrations.mlx_vlm.families.base import Family, ImageValue
from visioncache.integrations.mlx_vlm.imports import import_mlx
from visioncache.integrations.mlx_vlm.protocols import Array, Model, Processor

__all__ = ["prompt_positions", "split_prefill_exact"]


def prompt_positions(model: Model, input_ids: Array, hook: dict[str, Any]) -> dict[str, Any]:
    """The full prompt's rotary positions as vllm-mlx derives them for a prefix hit's tail (the
    language model's ``get_rope_index``, M-RoPE families): ``position_ids`` and ``rope_deltas``,
    or nothing for 1-D RoPE (the cache offset is the position)."""
    mx = import_mlx()
    language_model = model.language_model
    get_rope_index = getattr(type(language_model), "get_rope_index", None)
    if not callable(get_rope_index):
        return {}
    mask = mx.ones(input_ids.shape, dtype=mx.int32)
    position_ids, rope_deltas = get_rope_index(
        language_model, input_ids, hook.get("image_grid_thw"), None, mask
    )
    if rope_deltas is None:
        rope_deltas = mx.zeros((input_ids.shape[0], 1), dtype=mx.int32)
    return {"position_ids": position_ids, "rope_deltas": rope_deltas.reshape(input_ids.shape[0], -1)}


class _Split(NamedTuple):
    """A probe: the prefix prompt and the rest ("{m}": an image), and how many images each holds."""

    prefix: str
    rest: str
    prefix_images: int
    images: int


_SPLITS = (
    _Split("describe {m}", " and {m} please", 1, 2),  # an image on each side
    _Split("describe", " {m} please", 0, 1),  # the image in the tail
    _Split("describe {m}", " and tell what it is please", 1, 1),  # text alone in the tail
)


def _new_cache(model: Model) -> Any:
    from mlx_vlm.models.cache import make_prompt_cache

    return make_prompt_cache(model.language_model)


def _prefill(family: Family, model: Model, input_ids: Array, values: Sequence[ImageValue]) -> Any:
    """The KV cache of a prompt prefilled whole: by the family's feed, or (no image) by the
    language model alone, as vllm-mlx prefills a text-only prompt."""
    cache = _new_cache(model)
    if values:
        family.forward(model, family.feed(model, input_ids, family.hook_inputs(model, values)), cache=cache)
    else:
        model.language_model(input_ids, cache=cache)
    return cache


def _split_exact(
    family: Family, model: Model, processor: Processor, values: Sequence[ImageValue], split: _Split
) -> bool | None:
    """True / False: the split gives bit-identical last logits or not; None where the family
    does not allow it (nothing to prove) or the tokenizer does not keep the prefix."""
    mx = import_mlx()
    try:
        full_ids = family.tokenize(processor, [split.prefix + split.rest], values[: split.images])
        prefix_ids = family.tokenize(processor, [split.prefix], values[: split.prefix_images])
    except PlaceholderMismatchError:
        return None  # a prompt the family does not take (PaliGemma's image opens its prompt)
    full_ids, prefix_ids = full_ids["input_ids"], prefix_ids["input_ids"]
    start, end = prefix_ids.shape[1], full_ids.shape[1]
    if not bool(mx.array_equal(full_ids[:, :start], prefix_ids).item()):
        return None
    if not family.reusable_prefix(model, full_ids.reshape(-1).tolist(), start, start):
        return None
    full_hook = family.hook_inputs(model, values[: split.images])
    full = family.feed(model, full_ids, full_hook)
    whole = family.forward(model, full, cache=_new_cache(model)).logits
    cache = _prefill(family, model, prefix_ids, values[: split.prefix_images])
    positions = prompt_positions(model, full_ids, full_hook)
    tail_inputs = family.window(full, start, end)
    if "position_ids" in positions:
        tail_inputs["position_ids"] = positions["position_ids"][..., start:end]
        tail_inputs["rope_deltas"] = positions["rope_deltas"]
    tail = model.language_model(full_ids[:, start:end], cache=cache, **tail_inputs).logits
    return bool(mx.array_equal(whole[:, -1], tail[:, -1]).item())


def split_prefill_exact(
    family: Family, model: Model, processor: Processor, values: Sequence[ImageValue], marker: str
) -> bool:
    """The probe splits (`_SPLITS`) the family allows, each prefilled once and as its prefix (its
    own prompt) plus the tail: True when at least one was tried and every one tried gave
    bit-identical last logits."""
    tried = []
    for split in _SPLITS:
        probe = split._replace(prefix=split.prefix.format(m=marker), rest=split.rest.format(m=marker))
        result = _split_exact(family, model, processor, values, probe)
        if result is not None:
            tried.append(result)
    return bool(tried) and all(tried)
