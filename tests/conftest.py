"""Shared fixtures: real encoded images (JPEG, PNG) as bytes, files and data URLs."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pybase64
import pytest
from PIL import Image

from visioncache.identity.path_memo import SETTLE_SECONDS


def encode_image(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + pybase64.b64encode(data).decode()


def random_image(seed: int, size: tuple[int, int] = (32, 24), mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = len(Image.new(mode, (1, 1)).getbands())
    pixels = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)


@pytest.fixture
def make_png() -> Callable[[int], bytes]:
    """Distinct small PNG files' bytes, one per seed."""
    return lambda seed: encode_image(random_image(seed))


@pytest.fixture
def photo_jpeg() -> bytes:
    """A real photo shipped with matplotlib (Grace Hopper, 512x600 JPEG)."""
    matplotlib = pytest.importorskip("matplotlib")
    path = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    return path.read_bytes()


def settle(path: Path) -> Path:
    """Make ``path`` a file the path memo may remember: its mtime set back, and its ctime (which
    no call sets back) left to age past the memo's settle window."""
    past = time.time() - 60
    os.utime(path, (past, past))
    time.sleep(max(0.0, path.stat().st_ctime + SETTLE_SECONDS + 0.05 - time.time()))
    return path


@pytest.fixture
def settled_file(tmp_path: Path) -> Callable[[bytes, str], Path]:
    """Write bytes to a file the path memo may remember (`settle`)."""

    def write(data: bytes, name: str = "image.png") -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        return settle(path)

    return write


@pytest.fixture(autouse=True)
def _no_visioncache_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see a developer's VISIONCACHE_* settings (e.g. a real Redis URL)."""
    for name in list(os.environ):
        if name.startswith("VISIONCACHE_"):
            monkeypatch.delenv(name)
