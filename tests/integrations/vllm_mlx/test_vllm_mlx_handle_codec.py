"""Image handles without a server: the codec (sealed digests), the kept bytes, and what the HTTP
side reads (`handle_codec`, `handles`, `handle_api`, `uploads`)."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.memory_tier import MemoryTier
from visioncache import ContentDigest, TierChain, VisionEmbeddingCache
from visioncache.integrations.handles.handle_codec import (
    HANDLE_PREFIX,
    HandleCodec,
    HandleExpiredError,
    MalformedHandleError,
    UnknownHandleError,
)
from visioncache.integrations.handles.handles import Handles
from visioncache.integrations.vllm_mlx.handle_api import handle_urls
from visioncache.tiers.serialization import dumps

DIGEST = bytes(range(32))


def test_a_handle_opens_to_the_digest_it_seals_and_is_the_same_for_one_image() -> None:
    codec = HandleCodec("tenant-a")
    handle = codec.seal(DIGEST)
    assert handle.startswith(HANDLE_PREFIX) and len(handle) == len(HANDLE_PREFIX) + 64
    assert codec.open(handle) == DIGEST
    assert HandleCodec("tenant-a").seal(DIGEST) == handle  # deterministic: one image, one handle
    assert codec.seal(bytes(32)) != handle
    assert DIGEST.hex() not in handle and base64.urlsafe_b64encode(DIGEST).decode()[:20] not in handle


@pytest.mark.parametrize("other", ["tenant-b", "", None, b"tenant-b"])
def test_another_tenants_handle_is_unknown(other: str | bytes | None) -> None:
    handle = HandleCodec(other).seal(DIGEST)
    assert handle != HandleCodec("tenant-a").seal(DIGEST)
    with pytest.raises(UnknownHandleError, match="not issued by this server for this tenant"):
        HandleCodec("tenant-a").open(handle)


def test_no_salt_and_an_empty_salt_are_different_tenants() -> None:
    with pytest.raises(UnknownHandleError):
        HandleCodec("").open(HandleCodec(None).seal(DIGEST))


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 63), st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
)
def test_every_altered_character_makes_a_handle_unknown(position: int, character: str) -> None:
    codec = HandleCodec("tenant-a")
    handle = codec.seal(DIGEST)
    token = handle[len(HANDLE_PREFIX) :]
    altered = token[:position] + character + token[position + 1 :]
    if altered == token:
        return
    with pytest.raises(UnknownHandleError):
        codec.open(HANDLE_PREFIX + altered)


@pytest.mark.parametrize(
    "text",
    [
        "visioncache://",
        "visioncache://abc",
        "visioncache://" + "A" * 63,
        "visioncache://" + "A" * 65,
        "visioncache://" + "+" * 64,
        "visioncache://" + "A" * 63 + "=",
        "visioncache://" + "é" * 64,
        "VISIONCACHE://" + "A" * 64,
        "https://example.invalid/" + "A" * 64,
    ],
)
def test_malformed_handles_are_refused_as_such(text: str) -> None:
    with pytest.raises(MalformedHandleError, match="malformed image handle"):
        HandleCodec("tenant-a").open(text)


def test_a_random_well_formed_handle_is_unknown() -> None:
    codec = HandleCodec("tenant-a")
    for _ in range(50):
        with pytest.raises(UnknownHandleError):
            codec.open(HANDLE_PREFIX + base64.urlsafe_b64encode(os.urandom(48)).decode())


# ---- kept bytes ------------------------------------------------------------------------------------
@pytest.fixture
def tier() -> Iterator[MemoryTier]:
    yield MemoryTier(None)


def handles_on(tier: MemoryTier | None, salt: str | None = "tenant-a", max_bytes: int = 1 << 20) -> Handles:
    handles = Handles(salt, None, max_bytes)
    if tier is not None:  # the tiers settings would build; a memory tier stands for disk or Redis here
        handles.kept = VisionEmbeddingCache(
            0,
            0,
            namespace="test handles",
            salt=salt,
            max_pixel_bytes=0,
            max_encoding_bytes=0,
            max_embedding_entries=None,
            max_embedding_bytes=max_bytes,
            tiers=TierChain([tier], max_pending_write_bytes=0),  # written on the caller's thread
        )
    return handles


def test_issued_handles_keep_the_bytes_and_resolve_to_the_content_digest() -> None:
    handles = handles_on(None)
    image = b"\x89PNG\r\n\x1a\n" + os.urandom(100)
    ((handle, digest),) = handles.issue([image])
    assert handles.digest(handle) == digest == VisionEmbeddingCache().image_digests([image])[0]
    assert handles.kept_bytes(digest) == image
    assert handles.encode_source(ContentDigest(digest)) == image
    assert handles.stats.handles_issued == 1 and handles.stats.handle_images_from_kept_bytes == 1


@pytest.mark.filterwarnings("ignore::visioncache.tiers.UnsignedTierWarning")
def test_bytes_a_tier_returns_for_another_digest_count_as_missing(tier: MemoryTier) -> None:
    writer = handles_on(tier)
    image, other = b"GIF89a" + os.urandom(64), b"GIF89a" + os.urandom(64)
    ((handle, digest),) = writer.issue([image])
    ((_, other_digest),) = writer.issue([other])
    assert writer.kept_bytes(digest) == image  # from memory
    # Someone who can write to the (unsigned) shared tier stores, under each key, a well-formed
    # entry holding the other image's bytes (a blob merely moved would fail the tier's own check).
    keys = {writer.kept.key("embedding", [ContentDigest(d)]): d for d in (digest, other_digest)}
    for key, value in zip(keys, (other, image), strict=True):
        tier.put(key, dumps({"value": value, "cost": 0.0}, context=key))
    reader = handles_on(tier)  # another process: memory empty, the tier shared
    assert reader.kept_bytes(digest) is None and reader.kept_bytes(other_digest) is None
    assert reader.stats.handle_bytes_corrupt == 2
    with pytest.raises(HandleExpiredError, match="send the image again"):
        reader.encode_source(ContentDigest(digest))
    assert reader.digest(handle) == digest  # the handle itself is fine: only its bytes are gone


def test_held_pins_the_kept_bytes_and_refuses_a_handle_with_nothing_left() -> None:
    image = b"GIF89a" + os.urandom(400)
    handles = handles_on(None, max_bytes=len(image) + 100)  # room for one image's bytes
    ((_, digest),) = handles.issue([image])
    engine = VisionEmbeddingCache()
    with handles.held([digest], [engine]):
        handles.issue([b"GIF89a" + os.urandom(400)])  # would evict the first image's bytes
        assert handles.kept_bytes(digest) == image  # pinned: still there
    handles.issue([b"GIF89a" + os.urandom(400)])  # unpinned now: evicted
    assert handles.kept_bytes(digest) is None
    with pytest.raises(HandleExpiredError), handles.held([digest], [engine]):
        pass
    engine.set_image_embeddings([ContentDigest(digest)], [b"features"])  # features alone suffice
    with handles.held([digest], [engine]):
        assert engine.snapshot().levels["embedding"].pinned == 1
    assert handles.stats.handles_missing == 1 and handles.stats.handles_resolved == 2


# ---- the HTTP side -----------------------------------------------------------------------------------
def test_handles_are_found_where_images_go_and_nowhere_else() -> None:
    handle = HandleCodec(None).seal(DIGEST)
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": handle}}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": handle + "x"}]},
            {"role": "user", "content": [{"type": "image", "image": "visioncache://z"}]},
            {"role": "user", "content": [{"type": "text", "text": handle}]},  # text mentioning one
            {"role": "assistant", "content": handle},
        ]
    }
    assert handle_urls(json.dumps(body).encode()) == [handle, handle + "x", "visioncache://z"]
    assert handle_urls(b'{"messages": []}') == []
    assert handle_urls(b"visioncache:// not json") == []


@pytest.mark.skipif(sys.platform == "win32", reason="no vllm-mlx")
def test_upload_bodies_decode_strictly_and_are_bounded() -> None:
    pytest.importorskip("vllm_mlx")
    from visioncache.integrations.vllm_mlx.uploads import UploadError, _json_upload

    png = b"\x89PNG\r\n\x1a\n" + os.urandom(30)
    encoded = base64.b64encode(png).decode()
    assert _json_upload(json.dumps({"image": encoded}).encode()) == ([png], True)
    images, encode = _json_upload(
        json.dumps({"images": ["data:image/png;base64," + encoded, encoded], "encode": False}).encode()
    )
    assert images == [png, png] and encode is False
    for bad in (
        {"image": "data:image/png," + encoded},  # percent-encoded data URLs are not taken
        {"image": encoded[:-1]},
        {"image": 42},
        {"images": []},
        {"images": [encoded] * 17},
        {"image": encoded, "images": [encoded]},
        {"image": encoded, "encode": "yes"},
    ):
        with pytest.raises(UploadError) as raised:
            _json_upload(json.dumps(bad).encode())
        assert raised.value.status == 400
    with pytest.raises(UploadError) as raised:
        _json_upload(json.dumps({"image": "A" * (28 << 20)}).encode())
    assert raised.value.status == 413


def test_a_handle_held_open_resolves_to_what_its_request_found_without_opening_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from visioncache.integrations.handles.handles import KeptImage

    image = b"GIF89a" + os.urandom(400)
    handles = handles_on(None)
    ((handle, digest),) = handles.issue([image])
    engine = VisionEmbeddingCache()
    opened: list[str] = []
    real_open = handles.codec.open
    monkeypatch.setattr(
        handles.codec, "open", lambda text, *kind: opened.append(text) or real_open(text, *kind)
    )
    with handles.held_open([handle, handle], [engine]):  # features gone: the kept bytes, verified
        assert opened == [handle]  # named twice, opened once
        found = handles.resolve(handle)
        assert isinstance(found, KeptImage) and found.data == image and found.digest == digest
        assert opened == [handle]  # the step took what the check found
    assert handles.resolve(handle) == ContentDigest(digest) and len(opened) == 2  # no longer held
    engine.set_image_embeddings([ContentDigest(digest)], [b"features"])
    with handles.held_open([handle], [engine]):  # features held: no bytes read
        assert type(handles.resolve(handle)) is ContentDigest
        assert engine.snapshot().levels["embedding"].pinned == 1
        other = handles.for_tenant("tenant-b")  # another tenant's view holds nothing open
        with pytest.raises(UnknownHandleError):
            other.resolve(handle)
    assert handles.stats.handles_resolved == 3
