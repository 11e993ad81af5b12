"""One scheduler step's image requests, prepared together: one lookup, one tower call, per-request errors.

vllm-mlx preprocesses each request of a step on its own (decode, resize, tokenise) and runs the
vision tower inside each request's forward. Here, before vllm-mlx's ``_process_prompts`` runs, the
images of every image request of the step are looked up in visioncache at once; the images
missing from it (deduplicated across requests) are decoded, preprocessed and encoded in ONE tower
call; each request then gets its token ids, grids and features (mlx-vlm's ``cached_image_features``),
and vllm-mlx's own forward runs without the tower. A request whose input is bad gets its own error
(raised where vllm-mlx raises preprocessing errors, so the client gets the engine's usual error
response); the other requests of the step are unaffected. Images whose tokens stored KV already
holds are neither looked up nor encoded (`covered`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from visioncache import ContentDigest, VisionEmbeddingCache
from visioncache.integrations.handles import Handles
from visioncache.integrations.mlx_vlm import Model, Processor, encode_entries, inputs_from_features
from visioncache.integrations.mlx_vlm.families import Exactness, Family, Feed
from visioncache.integrations.vllm_mlx.covered import ImageLayouts, covered_images, layout_of, stand_in
from visioncache.integrations.vllm_mlx.images import materialise, resolve_images
from visioncache.integrations.vllm_mlx.kv_keys import PrefixKey, prefix_key
from visioncache.integrations.vllm_mlx.kv_tiers import KVTiers
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
    kv_reuse_refused: str | None = None  # why image prompts reuse no KV (logged once; in the stats)
    stats: EngineStats = field(default_factory=EngineStats)
    handles: Handles | None = None  # the installation's image handles (None: handles off)
    layouts: ImageLayouts = field(default_factory=ImageLayouts)  # by digest, for covered images
    kv_tiers: KVTiers | None = None  # image-aware KV prefixes in the tiers (None: not kept there)


@dataclass
class StoodIn:
    """Images of a request fed as stand-ins (`covered.stand_in`): where each one's tokens end,
    and what encodes them if a prefill reaches them after all."""

    state: EngineState
    images: dict[int, tuple[Any, int]]  # image index -> (its resolved input, its last token + 1)
    values: list[dict[str, Any]]  # every image's value, stand-ins included


@dataclass
class PreparedRequest:
    """A request whose model inputs were built from cached features."""

    model: Model
    family: Family
    prefix_key: PrefixKey | None  # its image-aware KV key (None: KV reuse off)
    hook: dict[str, Any] | None  # its images' features as the family's hook inputs (until prefill ends)
    fed: Feed | None = None  # its language-model inputs, built on first use
    stood_in: StoodIn | None = None  # images not encoded: their KV was expected to be reused

    def feed(self, input_ids: Any, start: int = 0) -> Feed:
        """The prompt's language-model inputs, built from the cached features as the model's own
        forward builds them (`Family.feed`), for a prefill from position ``start`` on: a stood-in
        image with a token at or after ``start`` is encoded first, so none is ever read."""
        self._encode_reached(start)
        if self.fed is None:
            assert self.hook is not None, "the request's features were released after its prefill"
            ids = input_ids if input_ids.ndim == 2 else input_ids[None, :]
            self.fed = self.family.feed(self.model, ids, self.hook)
        return self.fed

    def _encode_reached(self, start: int) -> None:
        stood_in = self.stood_in
        if stood_in is None or self.hook is None:
            return
        reached = sorted(index for index, (_, end) in stood_in.images.items() if end > start)
        if not reached:
            return
        state = stood_in.state
        encoded = encode_now(state, [stood_in.images[index][0] for index in reached])
        state.stats.kv_covered_images_encoded_late += len(reached)
        for index, value in zip(reached, encoded, strict=True):
            stood_in.values[index] = value
            del stood_in.images[index]
        self.hook = {**self.hook, **self.family.hook_inputs(self.model, stood_in.values)}
        self.fed = None


def wants_features(request: BatchRequest) -> bool:
    """Image requests without video or audio (those keep vllm-mlx's own path)."""
    return bool(request.images) and not request.videos and not request.audio


def _pixel_entries(state: EngineState, images: list[Any]) -> list[Any]:
    """Preprocessed entries of resolved images, through the pixel-only level.

    Looked up as the features were: a handle's (or an upload's) by its digest, its bytes read only
    to preprocess them, so nothing is hashed again; another input by the file vllm-mlx reads, as
    stock reads it.
    """
    family, processor, handles = state.family, state.processor, state.handles

    def preprocess(missing: list[Any]) -> Any:
        return family.preprocess(processor, [materialise(handles, image) for image in missing])

    keyed = [item if isinstance(item, ContentDigest) else materialise(handles, item) for item in images]
    return state.cache.preprocess_images(keyed, preprocess)


def _encoder(state: EngineState) -> Any:
    """``encode_fn`` for the step: missing images (as resolved) -> one tower call, counted.
    (The family was self-checked when the engine was built.)"""

    def encode_missing(images: list[Any]) -> list[dict[str, Any]]:
        entries = _pixel_entries(state, images)
        values = encode_entries(state.family, state.model, state.processor, entries)
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


def prepare_step(
    state: EngineState,
    requests: Sequence[BatchRequest],
    *,
    kv_reuse: bool,
    probe: Callable[[PrefixKey], int] | None = None,
) -> None:
    """Attach a PreparedRequest (or the request's error) to each image request of the step.

    ``probe`` (the prefix cache's `covered`) says how much of a prompt's key stored KV shares:
    images wholly inside it are neither looked up nor encoded (`covered`).
    """
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
    skips = [
        _covered(state, request.prompt, digests, probe) if kv_reuse and probe is not None else set()
        for request, _, digests in pending
    ]
    encoded = _encode(
        state,
        [
            [image for index, image in enumerate(images) if index not in skip]
            for (_, images, _), skip in zip(pending, skips, strict=True)
        ],
    )
    for (request, images, digests), skip, found in zip(pending, skips, encoded, strict=True):
        try:
            if isinstance(found, Exception):
                raise found
            values = _with_stand_ins(state, found, skip, digests)
            _set_inputs(state, request, values, digests if kv_reuse else None)
            prepared = getattr(request, STATE_ATTRIBUTE)
            if skip:
                token_ids = request.input_ids.reshape(-1).tolist()
                prepared.stood_in = _stood_in(state, token_ids, values, images, skip)
        except Exception as error:
            _fail(state, request, error)


def _covered(
    state: EngineState, prompt: str, digests: list[bytes], probe: Callable[[PrefixKey], int]
) -> set[int]:
    """The images stored KV covers (`covered_images`): the engine has seen them (their layouts
    are remembered) and their tokens lie inside the prefix a stored key shares with the prompt's.

    Only the prompt's text before its first image of unknown layout is keyed (placeholders are
    special tokens: what precedes one tokenises alike whatever follows), so nothing is
    preprocessed here; where the tokens stood in end is read from the full prompt later
    (`_stood_in`). Empty where the family takes no stand-ins.
    """
    family = state.family
    layouts = []
    for digest in digests:
        layout = state.layouts.get(digest)
        if layout is None:
            break
        layouts.append(layout)
    if not family.layout_fields or not layouts:
        return set()
    pieces = prompt.split(family.placeholder(state.processor))
    try:
        counts = [family.token_count(state.model, layout) for layout in layouts]
        head = family.placeholder(state.processor).join(pieces[: len(layouts) + 1])
        key = _key(state, layouts, counts, digests[: len(layouts)], head)
    except Exception:  # the request's own preparation reports its error
        return set()
    return set(covered_images(key.token_ids, family.image_token_id(state.model), counts, probe(key)))


def _stood_in(
    state: EngineState,
    token_ids: Sequence[int],
    values: list[dict[str, Any]],
    images: list[Any],
    skip: set[int],
) -> StoodIn:
    """The stood-in images of a prepared prompt, each with where its tokens end in ``token_ids``."""
    image_token = state.family.image_token_id(state.model)
    positions = [index for index, token in enumerate(token_ids) if token == image_token]
    ends = list(itertools.accumulate(int(value["image_features"].shape[0]) for value in values))
    return StoodIn(state, {index: (images[index], positions[ends[index] - 1] + 1) for index in skip}, values)


def _with_stand_ins(
    state: EngineState, found: list[dict[str, Any]], skip: set[int], digests: list[bytes]
) -> list[dict[str, Any]]:
    """Every image's value in order: stand-ins for ``skip``, the encoded or cached ones between
    (whose layouts are remembered)."""
    values, real = [], iter(found)
    for index, digest in enumerate(digests):
        if index in skip:
            layout = state.layouts.get(digest)
            assert layout is not None, "a covered image's layout is known"
            values.append(stand_in(layout))
            state.stats.kv_covered_images_not_encoded += 1
            continue
        value = next(real)
        layout = layout_of(state.family, value)
        if layout is not None:
            state.layouts.remember(digest, layout)
        values.append(value)
    return values


def _key(
    state: EngineState, layouts: Sequence[Any], counts: list[int], digests: list[bytes], prompt: str
) -> PrefixKey:
    """The prompt's image-aware KV key, its images of ``layouts`` (values carry theirs)."""
    token_ids = state.family.tokenize(state.processor, [prompt], layouts)["input_ids"].reshape(-1).tolist()
    return prefix_key(
        token_ids,
        state.family.image_token_id(state.model),
        list(zip(digests, counts, strict=True)),
        namespace=state.cache.namespace,
        salt=state.salt,
        reusable=partial(state.family.reusable_prefix, state.model, token_ids),
    )


def _fail(state: EngineState, request: BatchRequest, error: Exception) -> None:
    state.stats.image_request_errors += 1
    setattr(request, STATE_ATTRIBUTE, error)


def _set_inputs(
    state: EngineState, request: BatchRequest, values: list[dict[str, Any]], digests: Any
) -> None:
    inputs = inputs_from_features(state.model, state.processor, values, request.prompt)
    key = None
    if digests is not None:
        counts = [int(value["image_features"].shape[0]) for value in values]
        key = _key(state, values, counts, digests, request.prompt)
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
