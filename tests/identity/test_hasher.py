"""Image identity: one digest per content, whatever the form; never one digest for two inputs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import data_url, encode_image, random_image
from visioncache import (
    ImageTooLargeError,
    InvalidImageError,
    UnsupportedImageTypeError,
    compute_image_hash,
    compute_images_hash,
)
from visioncache.identity.hasher import ImageHasher
from visioncache.identity.path_memo import PathDigestMemo


def test_same_bytes_as_path_bytes_data_url_and_pathlike_share_a_digest(photo_jpeg, settled_file):
    path = settled_file(photo_jpeg, "hopper.jpg")
    digests = {
        compute_image_hash(photo_jpeg),
        compute_image_hash(bytearray(photo_jpeg)),
        compute_image_hash(memoryview(photo_jpeg)),
        compute_image_hash(str(path)),
        compute_image_hash(path),
        compute_image_hash(data_url(photo_jpeg, "image/jpeg")),
    }
    assert len(digests) == 1


def test_digest_is_256_bit_hex(make_png):
    digest = compute_image_hash(make_png(0))
    assert len(digest) == 64 and int(digest, 16) >= 0


def test_percent_encoded_data_url_matches_bytes(make_png):
    from urllib.parse import quote_from_bytes

    data = make_png(1)
    assert compute_image_hash("data:image/png," + quote_from_bytes(data)) == compute_image_hash(data)


# ---- collision suite: each way two inputs could wrongly share a key ------------------------------
def test_collision_order_of_images(make_png):
    a, b = make_png(1), make_png(2)
    assert compute_images_hash([a, b]) != compute_images_hash([b, a])


def test_collision_count_of_images(make_png):
    a = make_png(1)
    assert compute_images_hash([a]) != compute_images_hash([a, a])


def test_collision_array_shape():
    pixels = np.arange(24, dtype=np.uint8)
    assert compute_image_hash(pixels.reshape(2, 12)) != compute_image_hash(pixels.reshape(3, 8))
    assert compute_image_hash(pixels.reshape(2, 3, 4)) != compute_image_hash(pixels.reshape(2, 12))


def test_collision_array_dtype():
    pixels = np.zeros(8, dtype=np.uint8)
    assert compute_image_hash(pixels) != compute_image_hash(pixels.view(np.int8))
    assert compute_image_hash(pixels.view(np.uint16)) != compute_image_hash(pixels.view(np.int16))


VOID_DTYPES_OF_8_BYTES = {
    "struct i4,f4": np.dtype([("a", "<i4"), ("b", "<f4")]),
    "struct f4,i4": np.dtype([("a", "<f4"), ("b", "<i4")]),
    "struct names swapped": np.dtype([("b", "<i4"), ("a", "<f4")]),
    "struct f8": np.dtype([("x", "<f8")]),
    "struct big-endian i4,f4": np.dtype([("a", ">i4"), ("b", ">f4")]),
    "struct padded u1 at 4": np.dtype({"names": ["a"], "formats": ["u1"], "offsets": [4], "itemsize": 8}),
    "struct of a sub-array": np.dtype([("a", "<i4", (2,))]),
    "plain void": np.dtype("V8"),
}


def test_regression_structured_and_void_dtypes_of_one_itemsize_share_a_digest():
    """The digest framed ``dtype.str``, which is ``'|V8'`` for every structured, sub-array
    and void dtype of 8 bytes: the same bytes as any of them had one digest."""
    assert {dtype.str for dtype in VOID_DTYPES_OF_8_BYTES.values()} == {"|V8"}
    raw = np.arange(32, dtype=np.uint8)
    digests = {name: compute_image_hash(raw.view(dtype)) for name, dtype in VOID_DTYPES_OF_8_BYTES.items()}
    assert len(set(digests.values())) == len(digests), digests


def test_plain_dtype_digests_are_unchanged_by_the_full_dtype_framing():
    """Numeric dtypes keep the digest they had (``dtype.str`` framed, then the shape): entries
    already stored under them stay valid."""
    from blake3 import blake3

    from visioncache.identity.framing import domain_key, frame

    pixels = np.arange(24, dtype="<u2").reshape(2, 3, 4)
    header = frame(b"<u2") + np.array([3, 2, 3, 4], "<u8").tobytes()
    expected = blake3(header + pixels.tobytes(), key=domain_key("visioncache/image/ndarray/v1")).hexdigest()
    assert compute_image_hash(pixels) == expected


def test_array_layout_does_not_change_digest():
    pixels = np.arange(24, dtype=np.uint8).reshape(4, 6)
    assert compute_image_hash(np.asfortranarray(pixels)) == compute_image_hash(pixels.copy())


def test_collision_pil_mode_and_size():
    gray = Image.frombytes("L", (4, 6), bytes(range(24)))
    assert compute_image_hash(gray) != compute_image_hash(Image.frombytes("L", (6, 4), bytes(range(24))))
    assert compute_image_hash(gray) != compute_image_hash(Image.frombytes("P", (4, 6), bytes(range(24))))


def test_collision_pil_palette_and_transparency():
    first = Image.frombytes("P", (2, 2), bytes([0, 1, 2, 3]))
    second = first.copy()
    second.putpalette([255, 0, 0] * 256)
    assert compute_image_hash(first) != compute_image_hash(second)
    third = first.copy()
    third.info["transparency"] = 0
    assert compute_image_hash(first) != compute_image_hash(third)


def test_collision_pil_vs_array_vs_encoded_bytes():
    image = random_image(3)
    array = np.asarray(image)
    encoded = encode_image(image)
    digests = {compute_image_hash(image), compute_image_hash(array), compute_image_hash(encoded)}
    assert len(digests) == 3


# ---- the path memo ---------------------------------------------------------------------------------
def test_unchanged_path_is_not_reread(settled_file, make_png, monkeypatch):
    hasher = ImageHasher()
    path = settled_file(make_png(5))
    first = hasher.digest(str(path))
    opened = []
    real_open = os.open
    monkeypatch.setattr("os.open", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    assert hasher.digest(str(path)) == first
    assert opened == []
    hasher.path_memo.clear()  # the spy sees reads: after clearing the memo the file is read again
    assert hasher.digest(str(path)) == first
    assert len(opened) == 1


def test_edited_file_is_never_served_stale(settled_file, make_png):
    hasher = ImageHasher()
    original = make_png(6)
    path = settled_file(original)
    before = hasher.digest(str(path))
    assert len(hasher.path_memo) == 1
    # Same size, same inode, one byte changed, modification time moved (as any write does).
    edited = bytearray(original)
    edited[-20] ^= 0xFF
    path.write_bytes(bytes(edited))
    status = path.stat()
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns - 30 * 10**9))
    after = hasher.digest(str(path))
    assert after.hex() == compute_image_hash(bytes(edited)) and after != before


def test_regression_a_recreated_file_gets_the_deleted_files_digest(settled_file, make_png):
    """A file deleted and another of the same size written at the same path, its modification
    time set to the old one: ext4 reuses the inode, so (dev, ino, size, mtime) matched and the
    memo served the deleted file's digest. The status-change time, which no call sets back, is
    in the key now."""
    hasher = ImageHasher()
    original = make_png(6)
    path = settled_file(original)
    before = hasher.digest(str(path))
    old = path.stat()
    replacement = bytearray(original)
    replacement[-20] ^= 0xFF
    path.unlink()
    path.write_bytes(bytes(replacement))
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    new = path.stat()
    assert (new.st_size, new.st_mtime_ns) == (old.st_size, old.st_mtime_ns)
    after = hasher.digest(str(path))
    assert after.hex() == compute_image_hash(bytes(replacement)) and after != before


def test_regression_a_stat_key_equal_but_for_ctime_is_another_file(tmp_path: Path):
    """The same, whether or not this filesystem reuses the inode: two stat results equal in
    device, inode, size and modification time but not in status-change time are two files."""
    memo = PathDigestMemo()

    def status(ctime_ns: int) -> os.stat_result:  # mode, ino, dev, nlink, uid, gid, size, times
        seconds = (1, 1, ctime_ns // 10**9)
        return os.stat_result((0o100644, 7, 1, 1, 0, 0, 100, *seconds, *seconds, 10**9, 10**9, ctime_ns))

    old, recreated = status(10**9), status(2 * 10**9)
    memo.remember("/images/a.png", old, b"d" * 32)
    assert memo.lookup("/images/a.png", old) == b"d" * 32
    assert memo.lookup("/images/a.png", recreated) is None


def test_a_file_whose_ctime_is_recent_is_not_memoised(tmp_path: Path, make_png):
    """Setting the modification time back does not settle a file just written: its ctime is now."""
    hasher = ImageHasher()
    path = tmp_path / "touched.png"
    path.write_bytes(make_png(9))
    os.utime(path, (1e9, 1e9))
    hasher.digest(str(path))
    assert len(hasher.path_memo) == 0


def test_recently_written_file_is_not_memoised(tmp_path: Path, make_png):
    # The racy-timestamp rule: a file modified "now" may change again within the same tick.
    hasher = ImageHasher()
    path = tmp_path / "fresh.png"
    path.write_bytes(make_png(8))
    hasher.digest(str(path))
    assert len(hasher.path_memo) == 0


# ---- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("image", "error", "fragment"),
    [
        ("/no/such/file.png", InvalidImageError, "/no/such/file.png"),
        ("aGVsbG8gd29ybGQ=", InvalidImageError, "aGVsbG8gd29ybGQ="),
        ("data:image/png;base64,@@@@", InvalidImageError, "corrupt base64"),
        ("data:image/png;base64,abc", InvalidImageError, "corrupt base64"),
        ("data:image/png;base64" + "A" * 400, InvalidImageError, "malformed data: URL"),
        (b"", InvalidImageError, "empty content"),
        ("data:image/png;base64,", InvalidImageError, "empty content"),
        ("", InvalidImageError, "ContentId"),
        (12345, UnsupportedImageTypeError, "int"),
        (None, UnsupportedImageTypeError, "NoneType"),
        (np.array([], dtype=np.uint8), InvalidImageError, "non-empty"),
        (np.array([object()]), InvalidImageError, "numeric"),
    ],
)
def test_bad_input_raises_typed_error_naming_the_input(image, error, fragment):
    with pytest.raises(error) as raised:
        compute_image_hash(image)
    assert fragment in str(raised.value)


def test_long_input_is_truncated_in_the_message():
    with pytest.raises(InvalidImageError) as raised:
        compute_image_hash("x" * 5000)
    assert "x" * 81 not in str(raised.value) and "5000 chars" in str(raised.value)


def test_bad_input_errors_are_value_or_type_errors():
    with pytest.raises(ValueError):
        compute_image_hash("not a file")
    with pytest.raises(TypeError):
        compute_image_hash(3.5)


def test_oversize_input_raises_before_reading(settled_file, make_png):
    hasher = ImageHasher(max_image_bytes=100)
    data = make_png(9)
    for form in (data, data_url(data), str(settled_file(data))):
        with pytest.raises(ImageTooLargeError, match="max_image_bytes=100"):
            hasher.digest(form)


def test_empty_list_hash_is_no_images():
    assert compute_images_hash([]) == "no_images"


# ---- base64 decoded in place ---------------------------------------------------------------------
@pytest.mark.parametrize("text", ["data:x;base64,QUJD", "é-not ascii,QUJD", "short"])
def test_ascii_tail_is_the_slice(text):
    from visioncache.identity.base64_view import ascii_tail

    for start in range(len(text) + 1):
        tail = ascii_tail(text, start)
        expected = text[start:]
        assert (bytes(tail) == expected.encode()) if isinstance(tail, memoryview) else (tail == expected)


def test_data_url_payload_is_not_copied_out_of_the_url(make_png, monkeypatch):
    import visioncache.identity.hasher as identity

    decoded_types = []
    real_decode = identity.pybase64.b64decode
    monkeypatch.setattr(
        identity.pybase64, "b64decode", lambda s, **k: decoded_types.append(type(s)) or real_decode(s, **k)
    )
    data = make_png(3)
    assert compute_image_hash(data_url(data)) == compute_image_hash(data)
    assert decoded_types == [memoryview]
