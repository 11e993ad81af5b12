"""mlx-vlm integration: cached per-image preprocessing and cached vision features, as mlx arrays.

Two drop-ins for ``mlx_vlm.utils.prepare_inputs(processor, images=..., prompts=...)``:

- ``prepare_inputs(..., cache=cache)`` returns the same dict, but only images missing from the
  cache's pixel-only level are decoded and preprocessed; a warm request is tokenised from the
  cached layouts (grids, tiles) alone.
- ``prepare_inputs_with_features(model, ..., cache=cache)`` returns inputs whose images are
  already encoded (mlx-vlm's ``cached_image_features`` hook, plus what the hook drops, such as
  Qwen3-VL's deepstack features): only images missing from the embedding level are preprocessed
  and run through the tower, all of them in ONE call, split per image by its family
  (`visioncache.integrations.mlx_vlm.families`). ``forward(model, inputs)`` runs the model on
  them; mlx-vlm's ``generate_step`` takes them as they are.

An engine batching several requests per step uses the parts: ``cache.encode_batch(requests,
image_feature_encoder(model, processor, cache))``, then ``inputs_from_features`` per request.

Guarantee: the logits equal those of mlx-vlm without the cache (the family's self-check proves it
on the loaded model before the first value is served; the tests check it bit for bit). Entries
stay ``mlx.core.array`` (sized by their ``nbytes``), and a hit never converts to numpy. Cached
values depend on the processor and the model, so the cache's namespace must name both: build it
with ``VisionEmbeddingCache(namespace=cache_namespace(model_name, processor, model))``; a cache
whose namespace does not match raises ``ConfigurationError`` instead of serving entries computed
under another configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from visioncache import PixelOnlyCacheEntry, VisionEmbeddingCache
from visioncache.integrations.mlx_vlm.families import (
    SUPPORTED_MODEL_TYPES,
    Family,
    ImageValue,
    check_family,
    family_for,
    family_for_model,
    family_for_processor,
)
from visioncache.integrations.mlx_vlm.imports import import_mlx_vlm_utils
from visioncache.integrations.mlx_vlm.namespaces import (
    NamespaceFields,
    cache_namespace,
    check_namespace,
    parse_namespace,
)
from visioncache.integrations.mlx_vlm.protocols import Model, Processor

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "FeatureEncoder",
    "NamespaceFields",
    "cache_namespace",
    "cached_pixel_entries",
    "encode_entries",
    "forward",
    "image_feature_encoder",
    "inputs_from_features",
    "parse_namespace",
    "prepare_inputs",
    "prepare_inputs_with_features",
]

# encode_fn for VisionEmbeddingCache.encode_images / encode_batch: images -> one value per image
# (an `ImageValue`: "image_features", its layout, and the family's other arrays).
FeatureEncoder = Callable[[list[Any]], list[ImageValue]]


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def cached_pixel_entries(
    processor: Processor, images: Sequence[Any], cache: VisionEmbeddingCache
) -> list[PixelOnlyCacheEntry]:
    """One pixel entry per image; only images missing from the cache's pixel-only level go
    through the image processor, in one call."""
    family = family_for_processor(processor)
    return cache.preprocess_images(images, lambda missing: family.preprocess(processor, missing))


def prepare_inputs(
    processor: Processor,
    images: Any = None,
    prompts: str | list[str] | None = None,
    *,
    cache: VisionEmbeddingCache,
    add_special_tokens: bool = False,
) -> dict[str, Any]:
    """``mlx_vlm.utils.prepare_inputs`` with per-image preprocessing served from ``cache``.

    Returns ``input_ids``, ``attention_mask`` and the family's pixel inputs (``pixel_values``,
    ``image_grid_thw``, ...) as mlx arrays, equal to mlx-vlm's. Image sizing options must be set
    on ``processor.image_processor`` (where the namespace sees them), not passed per call.
    """
    utils = import_mlx_vlm_utils()
    image_list = [] if images is None else _as_list(images)
    if not image_list:
        return dict(utils.prepare_inputs(processor, prompts=prompts, add_special_tokens=add_special_tokens))
    family = family_for_processor(processor)
    check_namespace(cache, processor, None)
    family.check_prompts(processor, _as_list(prompts), len(image_list))  # before anything is processed
    entries = cached_pixel_entries(processor, image_list, cache)
    layouts = [family.pixel_layout(entry) for entry in entries]
    prompt_list = _as_list(prompts)
    inputs = family.tokenize(processor, prompt_list, layouts, add_special_tokens=add_special_tokens)
    placeholder = family.placeholder(processor)
    inputs.update(family.pixel_inputs(entries, [prompt.count(placeholder) for prompt in prompt_list]))
    return inputs


def encode_entries(
    family: Family, model: Model, processor: Processor, entries: Sequence[PixelOnlyCacheEntry]
) -> list[ImageValue]:
    """Values for preprocessed images: one tower call, or one per image where the self-check
    found batching inexact on this model."""
    if check_family(family, model, processor).batched or len(entries) < 2:
        return family.encode(model, entries)
    return [family.encode(model, [entry])[0] for entry in entries]


def image_feature_encoder(model: Model, processor: Processor, cache: VisionEmbeddingCache) -> FeatureEncoder:
    """The ``encode_fn`` for ``cache.encode_images`` / ``cache.encode_batch``.

    It preprocesses its images through the cache's pixel-only level, runs the vision tower ONCE
    over all of them, and returns one value per image. Engines batching several requests call
    ``cache.encode_batch(requests, encoder)``. The family's self-check runs here, once per model.
    """
    family = family_for(model, processor)
    check_family(family, model, processor)
    return lambda images: encode_entries(
        family, model, processor, cached_pixel_entries(processor, images, cache)
    )


def inputs_from_features(
    model: Model,
    processor: Processor,
    values: Sequence[ImageValue],
    prompts: str | list[str] | None,
    *,
    add_special_tokens: bool = False,
) -> dict[str, Any]:
    """Model inputs from per-image values (one per image placeholder, in prompt order).

    Returns ``input_ids``, ``attention_mask`` and the family's hook inputs (a zero-row
    ``pixel_values``, ``cached_image_features``, ...), for `forward` or mlx-vlm's ``generate_step``.
    """
    family = family_for(model, processor)
    inputs = family.tokenize(processor, _as_list(prompts), values, add_special_tokens=add_special_tokens)
    inputs.update(family.hook_inputs(model, values))
    return inputs


def forward(model: Model, inputs: dict[str, Any], *, cache: Any = None) -> Any:
    """The model's forward on ``inputs_from_features`` / ``prepare_inputs_with_features`` output
    (its ``.logits``), fed as the model's own uncached forward feeds its language model."""
    family = family_for_model(model)
    hook = {name: value for name, value in inputs.items() if name not in ("input_ids", "attention_mask")}
    feed = family.feed(model, inputs["input_ids"], hook)
    return family.forward(model, feed, cache=cache, mask=inputs.get("attention_mask"))


def prepare_inputs_with_features(
    model: Model,
    processor: Processor,
    images: Any,
    prompts: str | list[str] | None,
    *,
    cache: VisionEmbeddingCache,
    add_special_tokens: bool = False,
) -> dict[str, Any]:
    """Model inputs whose images are already encoded: the vision tower runs for misses only.

    Only images missing from the embedding level are preprocessed (through the pixel-only level)
    and encoded, all in one tower call; see ``inputs_from_features`` for what is returned.
    """
    image_list = [] if images is None else _as_list(images)
    if not image_list:
        return prepare_inputs(processor, None, prompts, cache=cache, add_special_tokens=add_special_tokens)
    family = family_for(model, processor)
    check_namespace(cache, processor, model)
    family.check_prompts(processor, _as_list(prompts), len(image_list))  # before anything is encoded
    encoder = image_feature_encoder(model, processor, cache)
    values = cache.encode_images(image_list, encoder, expect=family.fits(model))
    return inputs_from_features(model, processor, values, prompts, add_special_tokens=add_special_tokens)
