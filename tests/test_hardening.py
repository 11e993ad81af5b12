"""Regression tests of the core: no hang, no wrong value, typed errors before any change (the
promises in docs/guarantees.md).

Each test is named after the defect it pins; ``#11.N`` in a docstring is the item of the project's
issue tracker that reported it. Shared tiers' items live in tests/tiers/test_hardening_tiers.py;
image identity in tests/test_identity*.py.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import encode_image, random_image
from tests.support.internals import level_store
from visioncache import (
    ConfigurationError,
    EncoderOutputError,
    PixelOnlyCacheEntry,
    UnsupportedImageTypeError,
    UnsupportedInputTypeError,
    VisionCacheError,
    VisionEmbeddingCache,
    compute_image_hash,
)
from visioncache.errors import InvalidArgumentError, PinMismatchError
from visioncache.store.store import Store

IMAGES = [encode_image(random_image(seed)) for seed in range(4)]
A, B, C, D = IMAGES
JOIN_SECONDS = 10.0


def identity(image: bytes) -> int:
    """A number that names the image (24 bits of its digest: exact in float32)."""
    return int(compute_image_hash(image)[:6], 16)


def value_of(image: bytes) -> np.ndarray:
    """The value a correct encoder gives ``image``: it encodes the image's identity."""
    return np.full((2, 4), identity(image), np.float32)


class Encoder:
    """A correct encode_fn that records the images it was asked to encode."""

    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []

    def __call__(self, images: list[bytes]) -> list[np.ndarray]:
        self.calls.append(list(images))
        return [value_of(image) for image in images]


def correct(values: list[Any], images: list[bytes]) -> bool:
    """Whether each value is the one a correct encoder gives its image."""
    return all(np.array_equal(value, value_of(image)) for value, image in zip(values, images, strict=True))


def preprocess(images: list[bytes]) -> list[PixelOnlyCacheEntry]:
    return [PixelOnlyCacheEntry(np.ones((4, 3), np.float32), (1, 2, 2)) for _ in images]


def run_with_timeout(function: Callable[[], Any], seconds: float = JOIN_SECONDS) -> Any:
    """``function()`` on a daemon thread; fails the test (instead of hanging it) if it does not end."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as error:  # handed to the test thread below
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s: a claim was never released"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def sparse_value(_images: list[bytes]) -> list[Any]:
    return [torch.zeros(4, 4).to_sparse()]  # its .nbytes raises


class UnsizableArray:
    """An array-like leaf whose ``nbytes`` raises (as torch's sparse tensors do)."""

    @property
    def nbytes(self) -> int:
        raise RuntimeError("nbytes is not defined for this layout")


# ---- #11.1: a request can hang forever ----------------------------------------------------------
@pytest.mark.parametrize(
    "unsizable", [sparse_value, lambda _images: [UnsizableArray()]], ids=["sparse", "raises"]
)
def test_regression_unsizable_value_releases_its_claim(unsizable: Callable[[list[bytes]], list[Any]]) -> None:
    """#11.1: sizing the value raised inside `fulfil` before the claim was retired, so the next
    request for that image waited forever. Now: `EncoderOutputError`, and the claim is released."""
    cache = VisionEmbeddingCache()
    with pytest.raises(EncoderOutputError, match="cannot size"):
        run_with_timeout(lambda: cache.encode_images([A], unsizable))
    # A second request for the same image must not hang on the dead claim: it encodes it.
    value = run_with_timeout(lambda: cache.encode_images([A], Encoder())[0])
    assert np.array_equal(value, value_of(A))
    stats = cache.snapshot().levels["embedding"]
    assert (stats.entries, stats.computed) == (1, 1)  # the unsizable value was never stored


def test_regression_unsizable_value_wakes_the_waiters_with_the_error() -> None:
    """#11.1 at the store: a waiter joined before the owner's value turned out unsizable gets the
    error (no hang), and the next claim owns the key again."""
    store = Store(max_entries=4)
    owner, waiter = store.claim("k"), store.claim("k")
    assert owner.owner and waiter.future is not None and not waiter.owner
    with pytest.raises(EncoderOutputError):
        store.fulfil("k", torch.zeros(3, 3).to_sparse())
    with pytest.raises(EncoderOutputError):
        waiter.future.result(timeout=JOIN_SECONDS)
    assert store.claim("k").owner and "k" not in store and store.nbytes == 0


# ---- #11.2: store-then-retire gap ---------------------------------------------------------------
class GapStore(Store):
    """A store that runs queued hooks right after each `put` returns.

    A store whose `fulfil` stores with `put` and retires the claim afterwards (the defect) runs the
    hook inside that gap, which is what a concurrent thread may do there; a store that stores and
    retires under one lock never calls `put` from `fulfil`, so the hook runs after `fulfil`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hooks: list[Callable[[], None]] = []

    def put(self, key: str, value: Any, *, cost: float = 0.0) -> Any:
        result = super().put(key, value, cost=cost)
        while self.hooks:
            self.hooks.pop()()
        return result


def test_regression_store_then_retire_gap_loses_the_pinned_value() -> None:
    """#11.2: between storing a fresh (unpinned) value and retiring its claim, a concurrent put
    could evict it; a request that pinned the image then joined the stale claim, got the value,
    and nothing was stored under its pin. Constructed deterministically with `GapStore`."""
    store = GapStore(max_entries=1)
    assert store.claim("image").owner
    seen: dict[str, Any] = {}

    def concurrent_request() -> None:
        store.put("other", "other value")  # another request's value evicts the fresh entry
        store.pin("image")  # a request admitted now pins its image ...
        seen["claim"] = store.claim("image")  # ... and looks it up

    store.hooks.append(concurrent_request)
    store.fulfil("image", "value")
    if store.hooks:  # no gap in this store: the request comes right after
        store.hooks.pop()()
    claim = seen["claim"]
    if claim.owner:  # the entry was gone and nobody computes it: the request computes it
        store.fulfil("image", "value")
    elif claim.future is not None:
        assert claim.future.result(timeout=JOIN_SECONDS) == "value"
    assert "image" in store, "the pinned request's image was not stored under its pin"
    store.put("third", "x")  # the budget is one entry; a pinned one is not evicted
    assert "image" in store and "third" not in store
    store.unpin("image")
    assert store.stats().pinned == 0


def owns_its_memory(value: np.ndarray) -> bool:
    """Whether the array keeps alive no more memory than its own bytes."""
    return value.base is None or getattr(value.base, "nbytes", None) == value.nbytes


# ---- #11.4, beyond the writer: what a forked child inherits from its parent's threads --------------
def _in_forked_child(request: Callable[[], bool], seconds: float = JOIN_SECONDS) -> int:
    """Fork; the child runs ``request`` on a thread and exits 0 if it returned True in time, 3 if
    it was still blocked, 1 if it failed. Returns the child's exit code."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            outcome: list[bool] = []
            thread = threading.Thread(target=lambda: outcome.append(request()), daemon=True)
            thread.start()
            thread.join(seconds)
            code = 3 if thread.is_alive() else (0 if outcome == [True] else 1)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_regression_forked_child_waits_forever_on_a_claim_its_parent_owned() -> None:
    """#11 (no hang) with forks: a child forked while one of the parent's threads was encoding an
    image inherited that in-flight claim; its owner does not exist in the child, so the child's
    first request for the image waited forever. The child must compute it itself."""
    cache = VisionEmbeddingCache()
    encoding, release = threading.Event(), threading.Event()

    def slow_encoder(images: list[bytes]) -> list[np.ndarray]:
        encoding.set()
        assert release.wait(JOIN_SECONDS)
        return [value_of(image) for image in images]

    parent_request = threading.Thread(target=lambda: cache.encode_images([A], slow_encoder))
    parent_request.start()
    assert encoding.wait(JOIN_SECONDS)  # the parent's thread owns A's claim now
    try:
        code = _in_forked_child(lambda: correct(cache.encode_images([A], Encoder()), [A]), seconds=5.0)
    finally:
        release.set()
        parent_request.join(JOIN_SECONDS)
    assert code == 0, "the child's request for an image its parent was encoding " + (
        "never returned" if code == 3 else "failed"
    )
    assert correct(cache.get_image_embeddings([A]), [A])  # the parent's own claim completed


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_regression_forked_child_inherits_a_store_lock_held_by_a_parent_thread() -> None:
    """#11 (no hang) with forks: a child forked while another of the parent's threads was inside
    a store operation inherited the store's lock held, by a thread that does not exist in the
    child: the child's first miss waited forever (35 of 200 forks, with the parent storing values
    on a second thread). Simulated deterministically by holding the lock across the fork."""
    cache = VisionEmbeddingCache()
    store = level_store(cache, "embedding")
    holding, fork_started = threading.Event(), threading.Event()

    def store_operation_in_progress() -> None:
        with store._lock:  # what `put` or `claim` on another thread holds for a moment
            holding.set()
            fork_started.wait(JOIN_SECONDS)
            time.sleep(0.2)  # still inside when the fork begins

    other_thread = threading.Thread(target=store_operation_in_progress)
    other_thread.start()
    assert holding.wait(JOIN_SECONDS)
    fork_started.set()
    code = _in_forked_child(lambda: correct(cache.encode_images([B], Encoder()), [B]), seconds=5.0)
    other_thread.join(JOIN_SECONDS)
    assert code == 0, "the child's first miss " + ("never returned" if code == 3 else "failed")


# ---- #11.7: byte budgets do not bound memory for views ------------------------------------------
def test_regression_views_of_a_batch_keep_the_whole_batch_alive() -> None:
    """#11.7: per-image slices of one batch array were stored as they were, so an 8 MiB budget
    held the whole 32 MiB batch. Stored values must own their memory (copied when views)."""
    budget = 8 * 2**20
    images = [encode_image(random_image(seed, size=(8, 8))) for seed in range(100, 132)]
    cache = VisionEmbeddingCache(max_embedding_entries=None, max_embedding_bytes=budget)

    def encode(batch: list[bytes]) -> list[np.ndarray]:
        output = np.empty((len(batch), 256, 1024), np.float32)  # 1 MiB per image
        for index, image in enumerate(batch):
            output[index] = identity(image)
        return list(output)  # views into `output`

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        values = cache.encode_images(images, encode)
        assert all(
            np.array_equal(value, np.full((256, 1024), identity(image), np.float32))
            for value, image in zip(values, images, strict=True)
        )
        stored = [value for value in cache.get_image_embeddings(images) if value is not None]
        assert stored and all(owns_its_memory(value) for value in stored)
        del values, stored
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.snapshot().levels["embedding"].bytes <= budget
    assert held <= budget + 2**20, f"{held / 2**20:.1f} MiB alive for an {budget / 2**20:.0f} MiB budget"


def test_regression_arrays_over_a_received_payload_keep_the_whole_payload_alive() -> None:
    """#11.7, for arrays over a bytes object: an encoder that receives one payload for the batch
    (a remote encoder's response) and returns ``np.frombuffer(payload, offset=..., count=...)``
    per image. Their base is the bytes object, which has no ``nbytes``, so they were taken for
    owners of their memory: an 8 MiB budget kept a 32 MiB payload alive."""
    budget, per_image = 8 * 2**20, 2**20
    images = [encode_image(random_image(seed, size=(8, 8))) for seed in range(200, 232)]
    cache = VisionEmbeddingCache(max_embedding_entries=None, max_embedding_bytes=budget)

    def encode(batch: list[bytes]) -> list[np.ndarray]:
        payload = b"".join(np.full(per_image // 4, identity(image), np.float32).tobytes() for image in batch)
        count = per_image // 4
        return [np.frombuffer(payload, np.float32, count, index * per_image) for index in range(len(batch))]

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        values = cache.encode_images(images, encode)
        assert all(
            bool((value == identity(image)).all()) for value, image in zip(values, images, strict=True)
        )
        stored = [value for value in cache.get_image_embeddings(images) if value is not None]
        assert stored and all(owns_its_memory(value) for value in stored)
        del values, stored
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= budget + 2**20, f"{held / 2**20:.1f} MiB alive for an {budget / 2**20:.0f} MiB budget"


def test_regression_torch_views_of_a_batch_are_copied_when_stored() -> None:
    """#11.7 for torch: a stored slice must not keep the batch's whole storage alive."""
    images = IMAGES[:3]
    cache = VisionEmbeddingCache()
    batch_output = torch.arange(3 * 1000, dtype=torch.float32).reshape(3, 1000)
    values = cache.encode_images(images, lambda batch: list(batch_output[: len(batch)]))
    for index, value in enumerate(cache.get_image_embeddings(images)):
        assert (
            value is not None
            and torch.equal(value, batch_output[index])
            and torch.equal(value, values[index])
        )
        assert value.untyped_storage().nbytes() == value.nbytes  # owns exactly its own bytes
    assert cache.snapshot().levels["embedding"].bytes == 3 * 1000 * 4


# ---- typed errors before any state change ---------------------------------------------------------
def populated(enabled: bool) -> VisionEmbeddingCache:
    """A cache with entries, hits and misses in several levels, so an unchanged snapshot means
    something."""
    cache = VisionEmbeddingCache(enabled=enabled)
    cache.encode_images([A, B], Encoder())
    cache.get_image_embeddings([A, C])
    cache.preprocess_images([A], preprocess)
    cache.set_pixel_cache([A], "prompt", np.zeros(3, np.float32), np.arange(3))
    cache.get_pixel_cache([A], "prompt")
    cache.set_encoding_cache([B], "prompt", np.zeros(2), 1, np.zeros(2))
    return cache


BAD_IMAGE_LISTS: dict[str, Callable[[], Any]] = {
    "None": lambda: None,
    "generator": lambda: (image for image in [A, D]),
    "set": lambda: {A, D},
    "one image, not a list": lambda: D,
}
PIXELS, IDS = np.zeros((4, 3), np.float32), np.arange(5)
CALLS: dict[str, Callable[[VisionEmbeddingCache, Any, Encoder], Any]] = {
    "encode_images": lambda cache, images, encoder: cache.encode_images(images, encoder),
    "encode_batch(requests)": lambda cache, images, encoder: cache.encode_batch(images, encoder),
    "encode_batch([request])": lambda cache, images, encoder: cache.encode_batch([[A], images], encoder),
    "get_image_embeddings": lambda cache, images, _: cache.get_image_embeddings(images),
    "set_image_embeddings": lambda cache, images, _: cache.set_image_embeddings(images, [value_of(D)] * 2),
    "pinned": lambda cache, images, _: cache.pinned(images).__enter__(),
    "preprocess_images": lambda cache, images, encoder: cache.preprocess_images(images, encoder),
    "get_pixel_cache": lambda cache, images, _: cache.get_pixel_cache(images, "prompt"),
    "set_pixel_cache": lambda cache, images, _: cache.set_pixel_cache(images, "prompt", PIXELS, IDS),
    "get_pixel_values": lambda cache, images, _: cache.get_pixel_values(images),
    "set_pixel_values": lambda cache, images, _: cache.set_pixel_values(images, PIXELS),
    "get_encoding_cache": lambda cache, images, _: cache.get_encoding_cache(images, "prompt"),
    "set_encoding_cache": lambda cache, images, _: cache.set_encoding_cache(images, "prompt", IDS, 1, IDS),
}


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
@pytest.mark.parametrize("bad", list(BAD_IMAGE_LISTS))
@pytest.mark.parametrize("method", list(CALLS))
def test_regression_non_sequence_images_raise_one_typed_error_everywhere(
    method: str, bad: str, enabled: bool
) -> None:
    """#11 typed errors: None, generators, sets or a bare image where a list of images is expected
    raise `UnsupportedImageTypeError` from every method, enabled or disabled, before anything
    changes (a generator used to be consumed by some methods and refused by others)."""
    cache = populated(enabled)
    before = cache.get_stats()
    encoder = Encoder()
    with pytest.raises(UnsupportedImageTypeError):
        CALLS[method](cache, BAD_IMAGE_LISTS[bad](), encoder)
    assert encoder.calls == []
    assert cache.get_stats() == before


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
@pytest.mark.parametrize(
    ("values", "error"),
    [
        (None, UnsupportedInputTypeError),
        ((value for value in [value_of(A), value_of(B)]), UnsupportedInputTypeError),
        ([value_of(A)], InvalidArgumentError),
        ([value_of(A), torch.zeros(2, 2).to_sparse()], InvalidArgumentError),
        ([value_of(A), UnsizableArray()], InvalidArgumentError),
    ],
    ids=["None", "generator", "too few", "sparse", "nbytes raises"],
)
def test_regression_bad_values_in_set_image_embeddings_store_nothing(
    values: Any, error: type[Exception], enabled: bool
) -> None:
    """#11 typed errors: ``values=None`` or an unsizable value raised an untyped error, after
    storing the values before it. Now a typed error and no partial store."""
    cache = populated(enabled)
    before = cache.get_stats()
    with pytest.raises(error):
        cache.set_image_embeddings([C, D], values)
    assert cache.get_stats() == before
    assert cache.get_image_embeddings([C, D]) == [None, None]


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
@pytest.mark.parametrize(
    ("expect", "error"),
    [
        (5, TypeError),
        ("4", TypeError),
        ([2.0], TypeError),
        ([True], TypeError),
        ([2, 2], InvalidArgumentError),
        ([], InvalidArgumentError),
    ],
    ids=["int", "str", "float count", "bool count", "too long", "too short"],
)
def test_regression_malformed_expect_is_the_callers_error(
    expect: Any, error: type[Exception], enabled: bool
) -> None:
    """#10.6 / #11: ``expect=`` of the wrong type or length is the caller's mistake (a typed
    TypeError / `InvalidArgumentError`), raised before any lookup, not an `EncoderOutputError`."""
    cache = populated(enabled)
    before = cache.get_stats()
    encoder = Encoder()
    with pytest.raises(error) as raised:
        cache.encode_images([A], encoder, expect=expect)
    assert isinstance(raised.value, VisionCacheError) and not isinstance(raised.value, EncoderOutputError)
    with pytest.raises(error):
        cache.encode_batch([[A], [B]], encoder, expect=[None, expect])
    with pytest.raises(InvalidArgumentError):  # one expectation per request
        cache.encode_batch([[A], [B]], encoder, expect=[None])
    assert encoder.calls == [] and cache.get_stats() == before


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
@pytest.mark.parametrize(
    "returned",
    [None, 3, 2.5, "xy", b"xy", {"embeds": np.zeros(2)}, {"a": np.zeros(2), "b": np.zeros(2)}],
    ids=["None", "int", "float", "str", "bytes", "one dict", "dict of two"],
)
def test_regression_encode_fn_returning_a_non_list_is_an_encoder_output_error(
    returned: Any, enabled: bool
) -> None:
    """#11: an ``encode_fn`` returning None or an int raised a bare TypeError from ``list()``.
    A dict (a per-image dict returned for the whole batch) iterates over its keys: when it has as
    many keys as images, the key strings were cached as embeddings. All are `EncoderOutputError`,
    and nothing is stored."""
    cache = populated(enabled)
    images = [C] if returned is None or not isinstance(returned, dict) or len(returned) == 1 else [C, D]
    entries = cache.snapshot().levels["embedding"].entries
    with pytest.raises(EncoderOutputError):
        cache.encode_images(images, lambda _images: returned)
    assert cache.snapshot().levels["embedding"].entries == entries
    assert cache.get_image_embeddings(images) == [None] * len(images)
    encoder = Encoder()  # a later call retries: nothing was left claimed
    assert correct(cache.encode_images(images, encoder), images)
    assert len(encoder.calls) == 1


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
@pytest.mark.parametrize(
    "settings",
    [{"namespace": "\ud800"}, {"salt": "\udcff"}, {"namespace": ""}, {"namespace": 7}, {"salt": 7}],
    ids=["surrogate namespace", "surrogate salt", "empty namespace", "int namespace", "int salt"],
)
def test_regression_unencodable_namespace_or_salt_is_a_configuration_error(
    settings: dict[str, Any], enabled: bool
) -> None:
    """#11: a namespace or salt that UTF-8 cannot encode raised UnicodeEncodeError at the first
    key, not at construction. Now `ConfigurationError` from the constructor, enabled or not."""
    with pytest.raises(ConfigurationError):
        VisionEmbeddingCache(enabled=enabled, **settings)


def test_regression_unpin_without_a_pin_is_a_typed_error() -> None:
    """#10.6: `Store.unpin` without a matching pin raised a bare RuntimeError."""
    store = Store(max_entries=2)
    store.put("a", 1)
    with pytest.raises(PinMismatchError, match="without a matching pin"):
        store.unpin("a")
    store.pin("a")
    store.unpin("a")
    with pytest.raises(PinMismatchError):
        store.unpin("a")
    assert isinstance(PinMismatchError("x"), VisionCacheError) and store.stats().pinned == 0


def test_pinned_block_releases_its_pins_when_the_body_raises() -> None:
    cache = VisionEmbeddingCache(max_embedding_entries=1)
    with pytest.raises(KeyError), cache.pinned([A]):
        cache.encode_images([A], Encoder())
        raise KeyError("request failed")
    assert cache.snapshot().levels["embedding"].pinned == 0
    cache.encode_images([B], Encoder())  # A is evictable again
    assert cache.get_image_embeddings([A, B])[0] is None
