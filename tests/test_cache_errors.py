"""Bad input is a typed error, raised before anything changes, whether the cache is enabled or not
(docs/guarantees.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.support.cache_values import (
    A,
    B,
    C,
    D,
    Encoder,
    UnsizableArray,
    correct,
    preprocess,
    value_of,
)
from tests.support.optional import torch
from visioncache import (
    ConfigurationError,
    EncoderOutputError,
    UnsupportedImageTypeError,
    UnsupportedInputTypeError,
    VisionCacheError,
    VisionEmbeddingCache,
)
from visioncache.errors import InvalidArgumentError, PinMismatchError
from visioncache.store.store import Store


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
    """None, generators, sets or a bare image where a list of images is expected
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
        ([value_of(A), UnsizableArray()], InvalidArgumentError),
        *(
            [pytest.param([value_of(A), torch.zeros(2, 2).to_sparse()], InvalidArgumentError, id="sparse")]
            if torch is not None
            else []
        ),
    ],
    ids=["None", "generator", "too few", "nbytes raises", *(["sparse"] if torch is not None else [])],
)
def test_regression_bad_values_in_set_image_embeddings_store_nothing(
    values: Any, error: type[Exception], enabled: bool
) -> None:
    """``values=None`` or an unsizable value raised an untyped error, after
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
    """``expect=`` of the wrong type or length is the caller's mistake (a typed
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
    """An ``encode_fn`` returning None or an int raised a bare TypeError from ``list()``.
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
    """A namespace or salt that UTF-8 cannot encode raised UnicodeEncodeError at the first
    key, not at construction. Now `ConfigurationError` from the constructor, enabled or not."""
    with pytest.raises(ConfigurationError):
        VisionEmbeddingCache(enabled=enabled, **settings)


def test_regression_unpin_without_a_pin_is_a_typed_error() -> None:
    """`Store.unpin` without a matching pin raised a bare RuntimeError."""
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


def test_regression_a_key_of_a_level_that_does_not_exist_was_returned() -> None:
    """``key("nope", images)`` answered a key no level would ever read. Now `InvalidArgumentError`."""
    cache = VisionEmbeddingCache()
    with pytest.raises(InvalidArgumentError, match="level must be one of"):
        cache.key("nope", [A])
    assert cache.key("embedding", [A]) is not None
