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
from functools import partial
from typing import Any

from visioncache import ContentDigest, VisionEmbeddingCache
from visioncache.integrations.handles import Handles
from visioncache.integrations.mlx_vlm import Model, Processor, encode_entries, inputs_from_features
from visioncache.integrations.mlx_vlm.families import Exactness, Family, Feed
from visioncache.integrations.vllm_mlx.images import materialise, resolve_images
from visioncache.integrations.vllm_mlx.kv_keys import PrefixKey, prefix_key
from visioncache.integrations.vllm_mlx.protocols import BatchRequest
from visioncache.integrations.vllm_mlx.stats import EngineStats

__all__ = ["STATE_ATTRIBUTE", "EngineState", "PreparedRequest", "encode_now", "prepare_step", "release_step"]

# The attribute of vllm-mlx's MLLMBatchRequest holding a PreparedRequest or the request's error.
STATE_ATTRIBUTE = "_visioncache"


@dataclass
class EngineState:
    """What the integration keeps per model + processor, shared by the batch generators vllm-mlx
    builds for them (it builds a new one after a reset)."""

    cache: VisionEmbeddingCache
    model: Model
    processor: Processor
    family: Family
    salt: str | None
    kv_reuse: bool
    exactness: Exactness
    stats: EngineStats = field(default_factory=EngineStats)
    handles: Handles | None = None  # the installation's image handles (None: handles off)


@dataclass
class PreparedRequest:
    """A request whose model inputs were built from cached features."""

    model: Model
    family: Family
    prefix_key: PrefixKey | None  # its image-aware KV key (None: KV reuse off)
    hook: dict[str, Any] | None  # its images' features as the family's hook inputs (until prefill ends)
    fed: Feed | None = None  # its language-model inputs, built on first use

    def feed(self, input_ids: Any) -> Feed:
        """The prompt's language-model inputs, built from the cached features as the model's own
        forward builds them (`Family.feed`)."""
        if self.fed is None:
            assert self.hook is not None, "the request's features were released after its prefill"
            ids = input_ids if input_ids.ndim == 2 else input_ids[None, :]
            self.fed = self.family.feed(self.model, ids, self.hook)
        return self.fed


def wants_features(request: BatchRequest) -> bool:
    """Image requests without video or audio (those keep vllm-mlx's own path)."""
    return bool(request.images) and not request.videos and not request.audio


def _encoder(state: EngineState) -> Any:
    """``encode_fn`` for the step: missing images (as resolved) -> one tower call, counted.

    Pixel entries are looked up as the features were: a handle's (or an upload's) by its digest,
    its bytes read only to preprocess them, so nothing is hashed again; another input by the file
    vllm-mlx reads, as stock reads it. (The family was self-checked when the engine was built.)
    """
    family, model, processor = state.family, state.model, state.processor

    def preprocess(missing: list[Any]) -> Any:
        return family.preprocess(processor, [materialise(state.handles, image) for image in missing])

    def encode_missing(images: list[Any]) -> list[dict[str, Any]]:
        handles = state.handles
        keyed = [item if isinstance(item, ContentDigest) else materialise(handles, item) for item in images]
        values = encode_entries(family, model, processor, state.cache.preprocess_images(keyed, preprocess))
        state.stats.vision_tower_calls += 1
        state.stats.images_encoded += len(images)
        return values

    return encode_missing


def _encode(state: EngineState, image_lists: list[list[Any]]) -> list[list[dict[str, Any]] | Exception]:
    """Features for every request; one ``encode_batch`` unless it fails, then per request."""
    encoder, expect = _encoder(state), state.family.fits(state.model)
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


def encode_now(state: EngineState, images: list[Any]) -> list[dict[str, Any]]:
    """Features for ``images`` outside a step (an upload encoding ahead of use): a step's lookup,
    encoder and counters; raises the images' error."""
    (values,) = _encode(state, [images])
    if isinstance(values, Exception):
        raise values
    return values


def prepare_step(state: EngineState, requests: Sequence[BatchRequest], *, kv_reuse: bool) -> None:
    """Attach a PreparedRequest (or the request's error) to each image request of the step."""
    pending: list[tuple[Any, list[Any], list[bytes]]] = []
    for request in requests:
        if not wants_features(request) or getattr(request, STATE_ATTRIBUTE, None) is not None:
            continue
        state.stats.image_requests += 1
        sent = list(request.images or ())  # wants_features: there are some
        try:  # a prompt the family cannot take fails before its images are read or encoded
            state.family.check_prompt(state.processor, request.prompt, len(sent))
            images, digests = resolve_images(state.cache, state.handles, sent)
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


def _fail(state: EngineState, request: BatchRequest, error: Exception) -> None:
    state.stats.image_request_errors += 1
    setattr(request, STATE_ATTRIBUTE, error)


def _set_inputs(
    state: EngineState, request: BatchRequest, values: list[dict[str, Any]], digests: Any
) -> None:
    inputs = inputs_from_features(state.model, state.processor, values, request.prompt)
    key = None
    if digests is not None:
        token_ids = inputs["input_ids"].reshape(-1).tolist()
        key = prefix_key(
            token_ids,
            state.family.image_token_id(state.model),
            [
                (digest, int(value["image_features"].shape[0]))
                for digest, value in zip(digests, values, strict=True)
            ],
            namespace=state.cache.namespace,
            salt=state.salt,
            reusable=partial(state.family.reusable_prefix, state.model, token_ids),
        )
    request.input_ids = inputs.pop("input_ids")
    request.attention_mask = inputs.pop("attention_mask")
    request.pixel_values = inputs.pop("pixel_values", None)
    request.image_grid_thw = inputs.pop("image_grid_thw", None)
    request.extra_kwargs = dict(inputs)
    hook = {"pixel_values": request.pixel_values, **inputs}
    if request.image_grid_thw is not None:
        hook["image_grid_thw"] = request.image_grid_thw
    setattr(request, STATE_ATTRIBUTE, PreparedRequest(state.model, state.family, key, hook))


def release_step(requests: Sequence[BatchRequest]) -> None:
    """After prefill: drop features and embeddings, keep the KV key (stored when the request ends)."""
    for request in requests:
        prepared = getattr(request, STATE_ATTRIBUTE, None)
        if isinstance(prepared, PreparedRequest):
            prepared.hook = prepared.fed = None
