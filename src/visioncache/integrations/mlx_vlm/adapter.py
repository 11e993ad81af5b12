"""mlx-vlm integration: cached per-image preprocessing and cached vision features, as mlx arrays.

Two drop-ins for ``mlx_vlm.utils.prepare_inputs(processor, images=..., prompts=...)``:

- ``prepare_inputs(..., cache=cache)`` returns the same dict, but only images missing from the
  cache's pixel-only level are decoded and preprocessed; a warm request is tokenised from the
  cached grids alone.
- ``prepare_inputs_with_features(model, ..., cache=cache)`` adds ``cached_image_features`` (mlx-vlm's
  own hook) so the model's forward and ``generate_step`` skip the vision tower: only images missing
  from the embedding level are preprocessed and run through the tower, all of them in ONE call,
  and the output is split per image by its grid.

An engine batching several requests per step uses the parts: ``cache.encode_batch(requests,
image_feature_encoder(model, processor, cache))``, then ``inputs_from_features`` per request.

Guarantee: the logits equal those of mlx-vlm without the cache (the tests check it bit for bit).
Entries stay ``mlx.core.array`` (sized by their ``nbytes``), and a hit never converts to numpy.
Cached values depend on the processor and the model, so the cache's namespace must name both:
build it with ``VisionEmbeddingCache(namespace=cache_namespace(model_name, processor, model))``;
a cache whose namespace does not match raises ``ConfigurationError`` instead of serving entries
computed under another configuration.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from visioncache import ConfigurationError, PixelOnlyCacheEntry, VisionEmbeddingCache
from visioncache.integrations.mlx_vlm.features import (
    check_model,
    encode_pixel_entries,
    feature_check,
    model_fingerprint,
    placeholder_pixels,
)
from visioncache.integrations.mlx_vlm.imports import import_mlx, import_mlx_vlm_utils
from visioncache.integrations.mlx_vlm.processing import (
    check_processor,
    preprocess_images,
    processor_fingerprint,
    tokenize_prompts,
)

__all__ = [
    "FeatureEncoder",
    "NamespaceFields",
    "cache_namespace",
    "cached_pixel_entries",
    "image_feature_encoder",
    "inputs_from_features",
    "parse_namespace",
    "prepare_inputs",
    "prepare_inputs_with_features",
]

# encode_fn for VisionEmbeddingCache.encode_images / encode_batch: images -> one value per image,
# {"image_features": (tokens, hidden) mx.array, "image_grid_thw": (1, 3) mx.array}.
FeatureEncoder = Callable[[list[Any]], list[dict[str, Any]]]


def cache_namespace(model_name: str, processor: Any, model: Any | None = None) -> str:
    """The namespace a cache needs to serve ``prepare_inputs`` (and, with ``model``, features).

    ``model_name`` names the weights (e.g. a repository id and revision): weights are not hashed,
    so two checkpoints of one architecture must be given different names.
    """
    if not isinstance(model_name, str) or not model_name:
        raise ConfigurationError(f"model_name must be a non-empty str, got {model_name!r}")
    check_processor(processor)
    namespace = f"mlx-vlm:{model_name};processor={processor_fingerprint(processor)}"
    if model is not None:
        check_model(model)
        namespace += f";model={model_fingerprint(model)}"
    return namespace


@dataclass(frozen=True)
class NamespaceFields:
    """The parts of a namespace built by ``cache_namespace``."""

    model_name: str
    processor: str  # processor_fingerprint(processor)
    model: str | None  # model_fingerprint(model), when the namespace names a model


# The fingerprints are the last fields and hex, so a model name holding ";" or "=" parses unchanged.
_NAMESPACE = re.compile(
    r"mlx-vlm:(?P<name>.+);processor=(?P<processor>[0-9a-f]+)(?:;model=(?P<model>[0-9a-f]+))?"
)


def parse_namespace(namespace: str) -> NamespaceFields | None:
    """The fields of a ``cache_namespace`` result, or None for any other namespace."""
    match = _NAMESPACE.fullmatch(namespace)
    if match is None:
        return None
    return NamespaceFields(match["name"], match["processor"], match["model"])


def _check_namespace(cache: VisionEmbeddingCache, processor: Any, model: Any | None) -> None:
    if not cache.enabled:
        return  # nothing is read or stored, so nothing can be served under a wrong identity
    fields = parse_namespace(cache.namespace)
    matches = (
        fields is not None
        and fields.processor == processor_fingerprint(processor)
        and (model is None or fields.model == model_fingerprint(model))
    )
    if not matches:
        raise ConfigurationError(
            f"the cache's namespace {cache.namespace!r} does not name this "
            f"{'model and processor' if model is not None else 'processor'} configuration; "
            "build the cache with VisionEmbeddingCache(namespace="
            "visioncache.integrations.mlx_vlm.adapter.cache_namespace(model_name, processor, model))"
        )


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def cached_pixel_entries(
    processor: Any, images: Sequence[Any], cache: VisionEmbeddingCache
) -> list[PixelOnlyCacheEntry]:
    """One pixel entry per image (mlx rows + grid); only images missing from the cache's
    pixel-only level go through the image processor, in one call."""
    return cache.preprocess_images(images, lambda missing: preprocess_images(processor, missing))


def prepare_inputs(
    processor: Any,
    images: Any = None,
    prompts: str | list[str] | None = None,
    *,
    cache: VisionEmbeddingCache,
    add_special_tokens: bool = False,
) -> dict[str, Any]:
    """``mlx_vlm.utils.prepare_inputs`` with per-image preprocessing served from ``cache``.

    Returns ``input_ids``, ``attention_mask``, ``pixel_values`` and ``image_grid_thw`` as mlx
    arrays, equal to mlx-vlm's. Image sizing options must be set on ``processor.image_processor``
    (where the namespace sees them), not passed per call.
    """
    utils = import_mlx_vlm_utils()
    image_list = [] if images is None else _as_list(images)
    if not image_list:
        return dict(utils.prepare_inputs(processor, prompts=prompts, add_special_tokens=add_special_tokens))
    check_processor(processor)
    _check_namespace(cache, processor, None)
    mx = import_mlx()
    entries = cached_pixel_entries(processor, image_list, cache)
    grids = [entry.image_grid_thw for entry in entries]
    inputs = tokenize_prompts(processor, _as_list(prompts), grids, add_special_tokens=add_special_tokens)
    inputs["pixel_values"] = mx.concatenate([entry.pixel_values for entry in entries])
    inputs["image_grid_thw"] = mx.concatenate(grids)
    return inputs


def image_feature_encoder(model: Any, processor: Any, cache: VisionEmbeddingCache) -> FeatureEncoder:
    """The ``encode_fn`` for ``cache.encode_images`` / ``cache.encode_batch``.

    It preprocesses its images through the cache's pixel-only level, runs the vision tower ONCE
    over all of them, and returns one ``{"image_features", "image_grid_thw"}`` dict per image.
    Engines batching several requests call ``cache.encode_batch(requests, encoder)``.
    """
    check_model(model)
    check_processor(processor)
    return lambda images: encode_pixel_entries(model, cached_pixel_entries(processor, images, cache))


def inputs_from_features(
    model: Any,
    processor: Any,
    values: Sequence[dict[str, Any]],
    prompts: str | list[str] | None,
    *,
    add_special_tokens: bool = False,
) -> dict[str, Any]:
    """Model inputs from per-image feature values (one per image placeholder, in prompt order).

    Returns ``input_ids``, ``attention_mask``, ``image_grid_thw``, ``cached_image_features`` and a
    zero-row ``pixel_values``, for ``model(...)`` or ``mlx_vlm``'s ``generate_step``.
    """
    mx = import_mlx()
    grids = [value["image_grid_thw"] for value in values]
    inputs = tokenize_prompts(processor, _as_list(prompts), grids, add_special_tokens=add_special_tokens)
    inputs["pixel_values"] = placeholder_pixels(model)
    inputs["image_grid_thw"] = mx.concatenate(grids)
    inputs["cached_image_features"] = mx.concatenate([value["image_features"] for value in values])
    return inputs


def prepare_inputs_with_features(
    model: Any,
    processor: Any,
    images: Any,
    prompts: str | list[str] | None,
    *,
    cache: VisionEmbeddingCache,
    add_special_tokens: bool = False,
) -> dict[str, Any]:
    """Model inputs whose images are already encoded: ``model(...)`` skips the vision tower.

    Only images missing from the embedding level are preprocessed (through the pixel-only level)
    and encoded, all in one tower call; see ``inputs_from_features`` for what is returned.
    """
    image_list = [] if images is None else _as_list(images)
    if not image_list:
        return prepare_inputs(processor, None, prompts, cache=cache, add_special_tokens=add_special_tokens)
    check_processor(processor)
    check_model(model)
    _check_namespace(cache, processor, model)
    encoder = image_feature_encoder(model, processor, cache)
    values = cache.encode_images(image_list, encoder, expect=feature_check(model))
    return inputs_from_features(model, processor, values, prompts, add_special_tokens=add_special_tokens)
