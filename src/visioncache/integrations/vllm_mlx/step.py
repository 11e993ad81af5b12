"""One scheduler step's image requests, prepared together: one lookup, one tower call, per-request errors.

vllm-mlx preprocesses each request of a step on its own (decode, resize, tokenise) and runs the
vision tower inside each request's forward. Here, before vllm-mlx's ``_process_prompts`` runs, the
images of every image request of the step are looked up in visioncache at once; the images
missing from it (deduplicated across requests) are decoded, preprocessed and encoded in ONE tower
call; each request then gets its token ids, grids and features (mlx-vlm's ``cached_image_features``),
and vllm-mlx's own forward runs without the tower. A request whose input is bad gets its own error
(raised where vllm-mlx raises preprocessing errors, so the client gets the engine's usual error
response); the other requests of the step are unaffected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from visioncache import VisionEmbeddingCache
from visioncache.integrations.mlx_vlm import (
    feature_check,
    image_feature_encoder,
    inputs_from_features,
    placeholder_pixels,
)
from visioncache.integrations.vllm_mlx.images import materialise, resolve_images
from visioncache.integrations.vllm_mlx.kv_keys import PrefixKey, prefix_key
from visioncache.integrations.vllm_mlx.stats import EngineStats

__all__ = ["STATE_ATTRIBUTE", "EngineState", "PreparedRequest", "prepare_step", "release_step"]

# The attribute of vllm-mlx's MLLMBatchRequest holding a PreparedRequest or the request's error.
STATE_ATTRIBUTE = "_visioncache"


@dataclass
class EngineState:
    """What the integration keeps per model + processor, shared by the batch generators vllm-mlx
    builds for them (it builds a new one after a reset)."""

    cache: VisionEmbeddingCache
    model: Any
    processor: Any
    salt: str | None
    kv_reuse: bool
    stats: EngineStats = field(default_factory=EngineStats)


@dataclass
class PreparedRequest:
    """A request whose model inputs were built from cached features."""

    model: Any
    prefix_key: PrefixKey | None  # its image-aware KV key (None: KV reuse off)
    features: Any | None  # all its images' features, in order (released after prefill)
    grids: Any | None
    embeddings: Any | None = None  # its input embeddings, built on first use (a prefix hit's tail)

    def input_embeddings(self, input_ids: Any) -> Any:
        """The prompt's input embeddings with the image features in place (the model's own merge)."""
        if self.embeddings is None:
            features = self.model.get_input_embeddings(
                input_ids,
                placeholder_pixels(self.model),
                image_grid_thw=self.grids,
                cached_image_features=self.features,
            )
            self.embeddings = features.inputs_embeds
        return self.embeddings


def wants_features(request: Any) -> bool:
    """Image requests without video or audio (those keep vllm-mlx's own path)."""
    return bool(request.images) and not request.videos and not request.audio


def _encoder(state: EngineState) -> Any:
    """``encode_fn`` for the step: missing images (as resolved) -> one tower call, counted."""
    encode = image_feature_encoder(state.model, state.processor, state.cache)

    def encode_missing(images: list[Any]) -> list[dict[str, Any]]:
        values = encode([materialise(image) for image in images])  # data URLs decoded only now
        state.stats.vision_tower_calls += 1
        state.stats.images_encoded += len(images)
        return values

    return encode_missing


def _encode(state: EngineState, image_lists: list[list[Any]]) -> list[list[dict[str, Any]] | Exception]:
    """Features for every request; one ``encode_batch`` unless it fails, then per request."""
    encoder, expect = _encoder(state), feature_check(state.model)
    try:
        return list(state.cache.encode_batch(image_lists, encoder, expect=expect))
    except Exception:  # one bad image must not fail the step: retry each request alone
        results: list[list[dict[str, Any]] | Exception] = []
        for images in image_lists:
            try:
                results.append(state.cache.encode_images(images, encoder, expect=expect))
            except Exception as error:
                results.append(error)
        return results


def prepare_step(state: EngineState, requests: Sequence[Any], *, kv_reuse: bool) -> None:
    """Attach a PreparedRequest (or the request's error) to each image request of the step."""
    pending: list[tuple[Any, list[Any], list[bytes]]] = []
    for request in requests:
        if not wants_features(request) or getattr(request, STATE_ATTRIBUTE, None) is not None:
            continue
        state.stats.image_requests += 1
        try:
            images, digests = resolve_images(state.cache, request.images)
        except Exception as error:
            _fail(state, request, error)
            continue
        pending.append((request, images, digests))
    if not pending:
        return
    state.stats.scheduler_steps += 1
    encoded = _encode(state, [images for _, images, _ in pending])
    for (request, _, digests), values in zip(pending, encoded, strict=True):
        try:
            if isinstance(values, Exception):
                raise values
            _set_inputs(state, request, values, digests if kv_reuse else None)
        except Exception as error:
            _fail(state, request, error)


def _fail(state: EngineState, request: Any, error: Exception) -> None:
    state.stats.image_request_errors += 1
    setattr(request, STATE_ATTRIBUTE, error)


def _set_inputs(state: EngineState, request: Any, values: list[dict[str, Any]], digests: Any) -> None:
    inputs = inputs_from_features(state.model, state.processor, values, request.prompt)
    key = None
    if digests is not None:
        key = prefix_key(
            inputs["input_ids"].reshape(-1).tolist(),
            int(state.model.config.image_token_id),
            [
                (digest, int(value["image_features"].shape[0]))
                for digest, value in zip(digests, values, strict=True)
            ],
            namespace=state.cache.namespace,
            salt=state.salt,
        )
    request.input_ids = inputs["input_ids"]
    request.attention_mask = inputs["attention_mask"]
    request.pixel_values = inputs["pixel_values"]
    request.image_grid_thw = inputs["image_grid_thw"]
    request.extra_kwargs = {"cached_image_features": inputs["cached_image_features"]}
    prepared = PreparedRequest(state.model, key, inputs["cached_image_features"], inputs["image_grid_thw"])
    setattr(request, STATE_ATTRIBUTE, prepared)


def release_step(requests: Sequence[Any]) -> None:
    """After prefill: drop features and embeddings, keep the KV key (stored when the request ends)."""
    for request in requests:
        prepared = getattr(request, STATE_ATTRIBUTE, None)
        if isinstance(prepared, PreparedRequest):
            prepared.features = prepared.grids = prepared.embeddings = None
