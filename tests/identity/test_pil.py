"""PIL images: one collision test per mode, bounded work and typed errors."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import encode_image, random_image
from visioncache import ImageTooLargeError, InvalidImageError, compute_image_hash
from visioncache.identity.hasher import ImageHasher

MODES = ["1", "L", "P", "PA", "LA", "La", "F", "I", "I;16", "I;16B", "RGB", "RGBA", "RGBa", "RGBX"]
MODES += ["CMYK", "YCbCr", "LAB", "HSV"]


def same_bytes(mode: str, raw: bytes, size: tuple[int, int] = (2, 2)) -> Image.Image:
    return Image.frombytes(mode, size, raw)


def palette_image(palette: bytes, palette_mode: str, mode: str = "P") -> Image.Image:
    pixels = bytes([0, 1, 2, 3]) if mode == "P" else bytes([0, 255, 1, 255, 2, 255, 3, 255])
    image = Image.frombytes(mode, (2, 2), pixels)
    image.putpalette(palette, palette_mode)
    return image


# ---- regressions --------------------------------------------------------------------------------
def test_regression_palette_alpha_collision():
    # getpalette() returns RGB only: two P images whose RGBA palettes differ only in alpha shared a
    # digest, and the second was served the first's embedding (they convert to different RGBA).
    opaque = palette_image(bytes([10, 20, 30, 255] * 4), "RGBA")
    clear = palette_image(bytes([10, 20, 30, 0] * 4), "RGBA")
    assert opaque.tobytes() == clear.tobytes() and opaque.getpalette() == clear.getpalette()
    assert opaque.convert("RGBA").tobytes() != clear.convert("RGBA").tobytes()
    assert compute_image_hash(opaque) != compute_image_hash(clear)


def test_collision_palette_mode():
    # The same raw palette bytes read as RGB or as RGBA entries are different colours.
    raw = bytes(range(48))
    assert compute_image_hash(palette_image(raw, "RGB")) != compute_image_hash(palette_image(raw, "RGBA"))


def test_regression_pa_palette_alpha_collision():
    first = palette_image(bytes([1, 2, 3, 255] * 4), "RGBA", mode="PA")
    second = palette_image(bytes([1, 2, 3, 7] * 4), "RGBA", mode="PA")
    assert first.mode == second.mode == "PA" and first.tobytes() == second.tobytes()
    assert compute_image_hash(first) != compute_image_hash(second)


def test_regression_multi_frame_collision():
    # Two animated GIFs with the same first frame and different later frames shared a digest.
    first_frame = random_image(1, (8, 8))
    gifs = []
    for later in (random_image(2, (8, 8)), random_image(3, (8, 8))):
        buffer = io.BytesIO()
        first_frame.save(buffer, "GIF", save_all=True, append_images=[later])
        gifs.append(Image.open(io.BytesIO(buffer.getvalue())))
    assert gifs[0].tobytes() == gifs[1].tobytes() and gifs[0].n_frames == 2
    assert compute_image_hash(gifs[0]) != compute_image_hash(gifs[1])


def test_regression_pil_size_check_counts_bytes_per_pixel():
    # Mode F is 4 bytes a pixel: the size check counted 1, letting 4x max_image_bytes through.
    image = Image.new("F", (10, 10))
    hasher = ImageHasher(max_image_bytes=399)
    with pytest.raises(ImageTooLargeError, match="400 bytes"):
        hasher.digest(image)
    ImageHasher(max_image_bytes=400).digest(image)


def test_regression_truncated_lazily_opened_image_raises_typed_error(tmp_path: Path):
    # Image.open() reads the header only; the pixels of a truncated file fail on load with OSError.
    data = encode_image(random_image(4, (64, 64)), "PNG")
    path = tmp_path / "truncated.png"
    path.write_bytes(data[: len(data) // 2])
    image = Image.open(path)
    with pytest.raises(InvalidImageError, match="truncated"):
        compute_image_hash(image)


# ---- one collision test per mode: the same raw bytes under two modes never share a digest ------
@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("L", "P"),  # grey levels vs palette indices
        ("LA", "La"),  # straight vs premultiplied alpha
        ("LA", "PA"),
        ("RGBA", "RGBa"),
        ("RGBA", "RGBX"),
        ("RGBA", "CMYK"),
        ("RGB", "YCbCr"),
        ("RGB", "LAB"),
        ("RGB", "HSV"),
        ("F", "I"),  # float32 vs int32: the same four bytes a pixel
        ("I;16", "I;16B"),  # little- vs big-endian 16-bit
        ("I;16", "LA"),  # two bytes a pixel either way
    ],
)
def test_collision_same_bytes_in_two_modes(first: str, second: str):
    size = len(same_bytes(first, bytes(64), (2, 2)).tobytes())
    raw = bytes(range(1, size + 1))
    one, other = same_bytes(first, raw), same_bytes(second, raw)
    assert one.tobytes() == other.tobytes()
    assert compute_image_hash(one) != compute_image_hash(other)


def test_collision_mode_1_packed_bits_vs_l():
    packed = Image.frombytes("1", (8, 1), b"\xaa")
    grey = Image.frombytes("L", (1, 1), b"\xaa")
    assert packed.tobytes() == grey.tobytes()
    assert compute_image_hash(packed) != compute_image_hash(grey)


@pytest.mark.parametrize("mode", ["F", "I", "I;16", "LA", "PA", "CMYK", "YCbCr", "1"])
def test_collision_one_pixel_changed_per_mode(mode: str):
    image = Image.new(mode, (4, 3))
    changed = image.copy()
    changed.putpixel((3, 2), 1 if mode in ("1", "F", "I", "I;16") else (1,) * len(image.getbands()))
    assert compute_image_hash(image) != compute_image_hash(changed)


def test_collision_transparency_info():
    first = Image.frombytes("P", (2, 2), bytes([0, 1, 2, 3]))
    third = first.copy()
    third.info["transparency"] = 0
    assert compute_image_hash(first) != compute_image_hash(third)


def test_collision_multi_frame_position():
    # np.asarray and image processors read the current frame: the position is part of the identity.
    buffer = io.BytesIO()
    frames = [random_image(seed, (8, 8)) for seed in range(3)]
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    at_start, at_end = (Image.open(io.BytesIO(buffer.getvalue())) for _ in range(2))
    at_end.seek(2)
    assert compute_image_hash(at_start) != compute_image_hash(at_end)
    assert at_end.tell() == 2  # hashing seeks through the frames and puts it back


def test_multi_frame_digest_is_stable_and_not_the_single_frame_digest():
    buffer = io.BytesIO()
    frames = [random_image(seed, (8, 8)) for seed in range(2)]
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    animated = Image.open(io.BytesIO(buffer.getvalue()))
    first = compute_image_hash(animated)
    assert compute_image_hash(Image.open(io.BytesIO(buffer.getvalue()))) == first
    assert compute_image_hash(animated.copy()) != first  # copy() keeps one frame only


# ---- size accounting -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_size_check_counts_exactly_the_pixel_bytes(mode: str):
    from visioncache.identity.pil import pil_pixel_bytes

    image = Image.new(mode, (13, 5))
    exact = len(image.tobytes())
    assert pil_pixel_bytes(mode, 13, 5) == exact
    ImageHasher(max_image_bytes=exact).digest(image)
    with pytest.raises(ImageTooLargeError):
        ImageHasher(max_image_bytes=exact - 1).digest(image)


def test_size_check_counts_every_frame():
    buffer = io.BytesIO()
    frames = [random_image(seed, (8, 8)) for seed in range(3)]
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    animated = Image.open(io.BytesIO(buffer.getvalue()))
    with pytest.raises(ImageTooLargeError):
        ImageHasher(max_image_bytes=8 * 8 * 3 * 2).digest(animated)
    assert animated.tell() == 0


def test_oversize_lazily_opened_image_is_refused_before_decoding(tmp_path: Path, monkeypatch):
    path = tmp_path / "big.png"
    Image.new("RGB", (300, 200)).save(path)
    image = Image.open(path)
    loads = []
    monkeypatch.setattr(type(image), "load", lambda self: loads.append(1))
    with pytest.raises(ImageTooLargeError):
        ImageHasher(max_image_bytes=300 * 200 * 3 - 1).digest(image)
    assert loads == []


def test_pil_image_and_its_array_and_file_are_three_domains():
    image = random_image(5)
    digests = {compute_image_hash(image), compute_image_hash(np.asarray(image))}
    digests.add(compute_image_hash(encode_image(image)))
    assert len(digests) == 3


def test_concurrent_lookups_of_one_multi_frame_image_agree_and_leave_its_frame():
    import threading

    buffer = io.BytesIO()
    frames = [random_image(seed, (16, 16)) for seed in range(4)]
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    animated = Image.open(io.BytesIO(buffer.getvalue()))
    animated.seek(1)
    expected = compute_image_hash(animated)
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.extend(compute_image_hash(animated) for _ in range(20)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 80 and animated.tell() == 1
