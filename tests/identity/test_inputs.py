"""Inputs as engines and clients send them (docs/inputs.md): any media, raw base64, caller-supplied IDs.

Content is content: the same bytes as bytes, a file, a ``data:`` URL (any MIME type) and, for
media, raw base64, share one digest. Strings that are none of the accepted forms are refused.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import quote_from_bytes

import numpy as np
import pybase64
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import data_url
from tests.media_samples import MEDIA, VIDEO_FORMATS, media_sample
from visioncache import InvalidImageError, UnsupportedInputTypeError, VisionEmbeddingCache, compute_image_hash
from visioncache.errors import InvalidArgumentError


def b64(data: bytes) -> str:
    return pybase64.b64encode(data).decode()


def every_form(data: bytes, directory: Path, mime: str = "application/octet-stream") -> dict[str, str]:
    """The digest of ``data`` given as bytes, bytearray, memoryview, file, data URLs."""
    path = directory / "content.bin"
    path.write_bytes(data)
    return {
        "bytes": compute_image_hash(data),
        "bytearray": compute_image_hash(bytearray(data)),
        "memoryview": compute_image_hash(memoryview(data)),
        "file": compute_image_hash(str(path)),
        "path object": compute_image_hash(path),
        "base64 data URL": compute_image_hash(data_url(data, mime)),
        "percent data URL": compute_image_hash(f"data:{mime}," + quote_from_bytes(data)),
    }


# ---- regressions ---------------------------------------------------------------------------------
def test_regression_non_image_file_is_refused(tmp_path: Path):
    # rapid-mlx's "no 64 KiB collision" test: two files of non-image bytes sharing their first 64 KiB.
    rng = np.random.default_rng(0)
    shared = rng.bytes(64 * 1024)
    first, second = tmp_path / "first.bin", tmp_path / "second.bin"
    first.write_bytes(shared + b"first tail")
    second.write_bytes(shared + b"second tail")
    assert compute_image_hash(str(first)) != compute_image_hash(str(second))
    assert compute_image_hash(str(first)) == compute_image_hash(shared + b"first tail")


def test_regression_video_path_and_video_data_url_are_refused(tmp_path: Path):
    video = media_sample("mp4")
    path = tmp_path / "clip.mp4"
    path.write_bytes(video)
    digests = {
        compute_image_hash(str(path)),
        compute_image_hash(data_url(video, "video/mp4")),
        compute_image_hash(video),
    }
    assert len(digests) == 1


def test_regression_raw_base64_is_refused():
    # Ollama's images: [...] and Anthropic's source.data send base64 without a data: prefix.
    png = media_sample("png")
    assert compute_image_hash(b64(png)) == compute_image_hash(png) == compute_image_hash(data_url(png))


def test_regression_unknown_name_error_names_the_accepted_forms_and_content_id():
    with pytest.raises(InvalidImageError) as raised:
        compute_image_hash("img_a.jpg")
    message = str(raised.value)
    assert "'img_a.jpg'" in message and "not an existing file (FileNotFoundError)" in message
    for form in ("data: URL", "base64", "bytes", "PIL image", "ContentDigest", "ContentId"):
        assert form in message


# ---- every media format, every form --------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(MEDIA))
def test_media_of_every_kind_has_one_digest_in_every_form(name: str, tmp_path: Path):
    data = media_sample(name)
    digests = every_form(data, tmp_path, mime=f"{MEDIA[name][1]}/{name}")
    digests["raw base64"] = compute_image_hash(b64(data))
    assert len(set(digests.values())) == 1, digests


def test_data_url_mime_type_does_not_change_the_digest():
    data = media_sample("wav")
    urls = [data_url(data, mime) for mime in ("audio/wav", "image/png", "application/octet-stream", "")]
    assert len({compute_image_hash(url) for url in urls}) == 1


# ---- raw base64: recognised only when it is media -------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "aGVsbG8gd29ybGQ=",  # "hello world": valid base64, not media
        "img_a.jpg",
        "photos/cat",  # base64 alphabet, 10 characters: not a multiple of 4
        "abcd",  # decodes to 3 bytes: no signature fits
        "//srv/data/x1234",  # decodes to an MPEG audio frame sync (weak signature, not accepted)
        "UDYKMyAy",  # "P6\n3 2": a PPM header (weak signature, not accepted)
        "file:///tmp/a.png",
    ],
)
def test_strings_that_are_not_files_urls_or_base64_media_are_refused(text: str):
    with pytest.raises(InvalidImageError, match="ContentId"):
        compute_image_hash(text)


def test_an_existing_file_wins_over_base64_with_the_same_text(tmp_path: Path, monkeypatch):
    name = b64(b"GIF89a" + bytes(range(30)))
    assert "/" not in name
    (tmp_path / name).write_bytes(b"the file's own bytes")
    monkeypatch.chdir(tmp_path)
    assert compute_image_hash(name) == compute_image_hash(b"the file's own bytes")
    os.remove(name)
    assert compute_image_hash(name) == compute_image_hash(b"GIF89a" + bytes(range(30)))


def test_base64_of_media_that_is_corrupt_later_is_refused():
    text = b64(media_sample("png"))
    with pytest.raises(InvalidImageError, match="corrupt base64"):
        compute_image_hash(text[:200] + "!" + text[201:])


def test_raw_base64_must_be_strict_no_line_breaks_no_url_safe_alphabet():
    text = b64(media_sample("jpeg"))
    wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    with pytest.raises(InvalidImageError):
        compute_image_hash(wrapped)
    url_safe = pybase64.urlsafe_b64encode(media_sample("jpeg")).decode()
    assert url_safe != text
    with pytest.raises(InvalidImageError):
        compute_image_hash(url_safe)


def test_raw_base64_longer_than_any_file_name_is_not_stat_ed(monkeypatch):
    data = media_sample("png") + bytes(8000)
    names: list[object] = []
    real_stat = os.stat
    monkeypatch.setattr("os.stat", lambda path, *a, **k: names.append(path) or real_stat(path, *a, **k))
    assert compute_image_hash(b64(data)) == compute_image_hash(data)
    assert names == []


# ---- ContentId -----------------------------------------------------------------------------------
def test_content_id_same_id_same_digest_different_ids_differ():
    from visioncache import ContentId

    assert compute_image_hash(ContentId("sha256:abc")) == compute_image_hash(ContentId("sha256:abc"))
    assert compute_image_hash(ContentId("sha256:abc")) != compute_image_hash(ContentId("sha256:abd"))
    assert ContentId("a") == ContentId("a") and hash(ContentId("a")) == hash(ContentId("a"))
    assert str(ContentId("sha256:abc")) == "sha256:abc"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("", InvalidArgumentError),
        ("   ", InvalidArgumentError),
        ("x" * 1025, InvalidArgumentError),
        (12345, UnsupportedInputTypeError),
        (b"sha256:abc", UnsupportedInputTypeError),
        (None, UnsupportedInputTypeError),
    ],
)
def test_content_id_validates_its_value(value: object, error: type[Exception]):
    from visioncache import ContentId

    with pytest.raises(error, match="ContentId"):
        ContentId(value)  # type: ignore[arg-type]


def test_content_id_is_frozen():
    import dataclasses

    from visioncache import ContentId

    identifier = ContentId("sha256:abc")
    with pytest.raises(dataclasses.FrozenInstanceError):
        identifier.value = "other"  # type: ignore[misc]


# ---- http(s) URLs: refused, never keyed by their text ----------------------------------------------
@pytest.mark.parametrize(
    "url", ["https://example.invalid/cat.png", "http://127.0.0.1:8080/a.jpg", "HTTPS://EXAMPLE.INVALID/B"]
)
def test_regression_http_url_keyed_by_its_text(url: str):
    # A URL names an image without containing it: what it serves can change (other content, a 404,
    # a redirect), so an entry keyed by its text could answer for content the URL no longer serves.
    from visioncache import ContentId

    cache = VisionEmbeddingCache()
    for call in (compute_image_hash, lambda url: cache.encode_images([url], lambda images: images)):
        with pytest.raises(InvalidImageError, match=r"http\(s\) URL.*Fetch it and pass the bytes.*ContentId"):
            call(url)
    assert cache.get_stats()["embedding_cache_misses"] == 0  # refused before any lookup
    # The caller who guarantees what the URL serves never changes says so with a ContentId.
    assert compute_image_hash(ContentId(url)) == compute_image_hash(ContentId(url))


# ---- ContentDigest: a digest visioncache computed, kept instead of the content ---------------------
def test_content_digest_is_the_identity_of_the_content_it_names(tmp_path: Path):
    from visioncache import ContentDigest, VisionEmbeddingCache

    png = media_sample("png")
    cache = VisionEmbeddingCache(salt="tenant")
    (digest,) = cache.image_digests([png])
    assert compute_image_hash(ContentDigest(digest)) == compute_image_hash(png) == digest.hex()
    encoded: list[object] = []

    def encode(images: list[object]) -> list[str]:
        encoded.extend(images)
        return ["features"] * len(images)

    assert cache.encode_images([png], encode) == ["features"]
    # The kept digest hits the entry the content made, without the content; a miss hands the
    # encoder the ContentDigest itself (the caller supplies the content it names).
    assert cache.encode_images([ContentDigest(digest)], encode) == ["features"] and encoded == [png]
    other = ContentDigest(bytes(32))
    assert cache.encode_images([other], encode) == ["features"] and encoded == [png, other]
    assert cache.key("embedding", [ContentDigest(digest)]) == cache.key("embedding", [png])


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (b"\x00" * 31, InvalidArgumentError),
        (b"\x00" * 33, InvalidArgumentError),
        ("00" * 32, UnsupportedInputTypeError),
        (bytearray(32), UnsupportedInputTypeError),
    ],
)
def test_content_digest_takes_exactly_32_bytes(value: object, error: type[Exception]):
    from visioncache import ContentDigest

    with pytest.raises(error, match="ContentDigest"):
        ContentDigest(value)  # type: ignore[arg-type]


# ---- collisions between the domains --------------------------------------------------------------
def test_collision_content_id_vs_content_vs_content_digest(tmp_path: Path):
    from visioncache import ContentDigest, ContentId

    text = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    path = tmp_path / "named"
    path.write_text(text)
    media = b64(media_sample("m4a"))
    assert compute_image_hash(text.encode()) == compute_image_hash(str(path))  # the ID's text as content
    digest = bytes.fromhex(compute_image_hash(media))
    digests = [
        compute_image_hash(ContentId(text)),
        compute_image_hash(text.encode()),
        compute_image_hash(ContentId(str(path))),
        compute_image_hash(ContentId(media)),
        compute_image_hash(media),
        compute_image_hash(ContentId(digest.hex())),
    ]
    assert len(set(digests)) == len(digests)
    assert compute_image_hash(ContentDigest(digest)) == compute_image_hash(media)


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=200).filter(str.strip))
def test_collision_content_id_never_equals_content_digest(text: str):
    from visioncache import ContentId

    identifier = compute_image_hash(ContentId(text))
    assert identifier != compute_image_hash(text.encode("utf-8", "surrogatepass"))
    assert identifier != compute_image_hash(ContentId("https://" + text))


# ---- properties over random payloads -------------------------------------------------------------
SIGNATURES = [name for name in MEDIA if name not in VIDEO_FORMATS]  # no OpenCV per example


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=5000))
def test_property_payload_without_media_signature_one_digest_base64_refused(payload: bytes):
    from visioncache.identity.sniff import SNIFF_BYTES, media_kind

    assume(media_kind(payload[:SNIFF_BYTES]) is None)
    with tempfile.TemporaryDirectory() as directory:
        assert len(set(every_form(payload, Path(directory)).values())) == 1
    with pytest.raises(InvalidImageError):
        compute_image_hash(b64(payload))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SIGNATURES), st.binary(max_size=5000), st.integers(min_value=0, max_value=2))
def test_property_payload_with_media_signature_raw_base64_is_the_content(
    name: str, tail: bytes, keep_padding: int
):
    payload = media_sample(name)[:64] + tail  # a media header, then anything
    payload = payload[: len(payload) - keep_padding]  # every padding length: 0, 1 or 2 "="
    with tempfile.TemporaryDirectory() as directory:
        digests = every_form(payload, Path(directory))
    digests["raw base64"] = compute_image_hash(b64(payload))
    assert len(set(digests.values())) == 1


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.binary(min_size=1, max_size=300))
def test_property_different_payloads_never_share_a_digest(first: bytes, second: bytes):
    assume(first != second)
    assert compute_image_hash(first) != compute_image_hash(second)
    assert compute_image_hash(data_url(first)) != compute_image_hash(data_url(second))


# ---- a video through the levels, end to end -------------------------------------------------------
def test_video_path_through_the_pixel_level(tmp_path: Path):
    video = media_sample("mp4")
    path = tmp_path / "clip.mp4"
    path.write_bytes(video)
    cache = VisionEmbeddingCache()
    pixel_values = np.arange(12, dtype=np.float32)
    cache.set_pixel_cache([str(path)], "describe the clip", pixel_values, np.arange(3))
    for same in (str(path), path, video, data_url(video, "video/mp4"), b64(video)):
        entry = cache.get_pixel_cache([same], "describe the clip")
        assert entry is not None and entry.pixel_values is pixel_values
    assert cache.get_pixel_cache([str(path)], "another prompt") is None


def test_video_path_through_the_embedding_level_as_one_opaque_item(tmp_path: Path):
    video = media_sample("mp4")
    path = tmp_path / "clip.mp4"
    path.write_bytes(video)
    cache = VisionEmbeddingCache()
    batches: list[list[object]] = []

    def encode(items: list[object]) -> list[np.ndarray]:
        batches.append(list(items))
        return [np.full((3, 4), len(batches), np.float32) for _ in items]

    first = cache.encode_images([str(path), media_sample("png")], encode)
    again = cache.encode_images([video, data_url(video, "video/mp4"), str(path)], encode)
    assert batches == [[str(path), media_sample("png")]]  # the path reached the encoder as given
    assert all(value is first[0] for value in again)
