"""Whether a prompt prefilled in two parts gives the logits of one prefill, on the loaded model.

An engine reusing KV (vllm-mlx's prefix cache, keyed by visioncache's image-aware ids) prefills a
chat turn as the cached state of the previous turn's prompt plus a tail: the tail is fed the
family's `Family.window` of the full prompt's inputs at the full prompt's positions. That equals a
single prefill only if the model's layers give the same numbers in two steps as in one: true of
attention layers on mlx-cpu, not always of recurrent ones (Qwen3.5's gated-delta layers, whose
chunked state update depends on where the chunks start). `split_prefill_exact` runs both ways on
the self-check's probe prompt (split after its first image, so the tail holds the second) and
compares the last logits bit for bit; where they differ, KV reuse would change the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from visioncache.integrations.mlx_vlm.families.base import Family, Feed, ImageValue
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


def _prefill(family: Family, model: Model, feed: Feed) -> Any:
    from mlx_vlm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model.language_model)
    return family.forward(model, feed, cache=cache).logits, cache


def split_prefill_exact(
    family: Family, model: Model, processor: Processor, values: Sequence[ImageValue], marker: str
) -> bool:
    """Prefill ``describe <image 1> and <image 2> please`` once, and as the prefix up to image 1's
    end (its own prompt) plus the tail; True when the last logits are bit-identical."""
    mx = import_mlx()
    prefix_prompt = f"describe {marker}"
    full_prompt = f"{prefix_prompt} and {marker} please"
    full_ids = family.tokenize(processor, [full_prompt], values)["input_ids"]
    prefix_ids = family.tokenize(processor, [prefix_prompt], values[:1])["input_ids"]
    start, end = prefix_ids.shape[1], full_ids.shape[1]
    if not bool(mx.array_equal(full_ids[:, :start], prefix_ids).item()):
        return False  # the tokenizer does not keep the prefix: nothing comparable to reuse
    full_hook = family.hook_inputs(model, values)
    full = family.feed(model, full_ids, full_hook)
    whole, _ = _prefill(family, model, full)
    _, cache = _prefill(family, model, family.feed(model, prefix_ids, family.hook_inputs(model, values[:1])))
    positions = prompt_positions(model, full_ids, full_hook)
    tail_inputs = family.window(full, start, end)
    if "position_ids" in positions:
        tail_inputs["position_ids"] = positions["position_ids"][..., start:end]
        tail_inputs["rope_deltas"] = positions["rope_deltas"]
    tail = model.language_model(full_ids[:, start:end], cache=cache, **tail_inputs).logits
    return bool(mx.array_equal(whole[:, -1], tail[:, -1]).item())
