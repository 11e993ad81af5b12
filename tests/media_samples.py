"""Real media files made on the spot: images by Pillow, video by OpenCV, WAV by the stdlib.

Formats no installed library writes (FLAC, Ogg, MP3 with an ID3 tag, M4A) are their real leading
structures (the part a signature check reads), followed by filler.
"""

from __future__ import annotations

import io
import struct
import tempfile
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tests.conftest import encode_image, random_image

__all__ = ["MEDIA", "VIDEO_FORMATS", "media_sample"]


def _pil(fmt: str, **options: object) -> Callable[[], bytes]:
    def make() -> bytes:
        buffer = io.BytesIO()
        random_image(7, (24, 16)).save(buffer, fmt, **options)
        return buffer.getvalue()

    return make


def _animated_gif() -> bytes:
    frames = [random_image(seed, (16, 16)) for seed in range(3)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    return buffer.getvalue()


def _video(extension: str, fourcc: str) -> Callable[[], bytes]:
    def make() -> bytes:
        import pytest

        cv2 = pytest.importorskip("cv2", reason="OpenCV (the mlx extra) writes the sample videos")
        with tempfile.TemporaryDirectory() as directory:
            path = str(Path(directory) / f"clip.{extension}")
            writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*fourcc), 5, (32, 24))
            for shade in (0, 80, 160):
                writer.write(np.full((24, 32, 3), shade, np.uint8))
            writer.release()
            return Path(path).read_bytes()

    return make


def _wav() -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(8000)
        writer.writeframes(np.sin(np.arange(800) / 5).astype("<i2").tobytes())
    return buffer.getvalue()


def _flac() -> bytes:  # "fLaC", then a last-metadata-block STREAMINFO header of 34 bytes
    return b"fLaC" + bytes([0x80, 0, 0, 34]) + bytes(range(34)) + b"\xff\xf8" + bytes(64)


def _ogg() -> bytes:  # one Ogg page (beginning of stream) holding a Vorbis identification header
    packet = b"\x01vorbis" + struct.pack("<IBIiiiBB", 0, 1, 8000, 0, 64000, 0, 0xB8, 1)
    page = b"OggS\x00\x02" + bytes(8) + struct.pack("<III", 1, 0, 0) + bytes([1, len(packet)])
    return page + packet


def _mp3() -> bytes:  # an ID3v2.4 tag of 10 bytes, then an MPEG-1 layer III frame header
    return b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10) + b"\xff\xfb\x90\x64" + bytes(413)


def _m4a() -> bytes:  # an ISO base media "ftyp" box with the M4A brand
    return struct.pack(">I", 24) + b"ftypM4A \x00\x00\x00\x00M4A isom" + bytes(64)


# name -> (maker, the media kind sniff must report)
MEDIA: dict[str, tuple[Callable[[], bytes], str]] = {
    "png": (lambda: encode_image(random_image(1)), "image"),
    "jpeg": (_pil("JPEG"), "image"),
    "gif": (_animated_gif, "image"),
    "webp": (_pil("WEBP"), "image"),
    "bmp": (_pil("BMP"), "image"),
    "tiff": (_pil("TIFF"), "image"),
    "ico": (_pil("ICO"), "image"),
    "mp4": (_video("mp4", "mp4v"), "video"),
    "mov": (_video("mov", "mp4v"), "video"),
    "avi": (_video("avi", "MJPG"), "video"),
    "mkv": (_video("mkv", "XVID"), "video"),
    "webm": (_video("webm", "VP80"), "video"),
    "wav": (_wav, "audio"),
    "flac": (_flac, "audio"),
    "ogg": (_ogg, "audio"),
    "mp3": (_mp3, "audio"),
    "m4a": (_m4a, "audio"),
}
VIDEO_FORMATS = ("mp4", "mov", "avi", "mkv", "webm")


def media_sample(name: str) -> bytes:
    """The bytes of a small file of format ``name`` (a key of `MEDIA`)."""
    return MEDIA[name][0]()
