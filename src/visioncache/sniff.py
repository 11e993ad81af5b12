"""Is this an image file? A signature check on the first bytes, so non-image bytes fail early.

Known signatures answer in well under a microsecond; anything else is offered to Pillow's own
format checks (each plugin's ``accept`` on the file's prefix), so every format Pillow can open
is accepted without visioncache keeping a list of them.
"""

from __future__ import annotations

__all__ = ["looks_like_image"]

_SIGNATURES = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",  # PNG
    b"GIF87a",
    b"GIF89a",
    b"BM",  # BMP
    b"II*\x00",  # TIFF, little-endian
    b"MM\x00*",  # TIFF, big-endian
    b"\x00\x00\x01\x00",  # ICO
)


def looks_like_image(prefix: bytes) -> bool:
    """True if ``prefix`` (the first 16+ bytes of a file) starts an image format Pillow knows."""
    if prefix.startswith(_SIGNATURES):
        return True
    if prefix[:4] == b"RIFF" and prefix[8:12] == b"WEBP":
        return True
    return _pillow_accepts(prefix)


def _pillow_accepts(prefix: bytes) -> bool:
    try:
        from PIL import Image
    except ImportError:  # without Pillow only the signatures above are known
        return False
    Image.init()
    for _factory, accept in Image.OPEN.values():
        if accept is None:
            continue
        try:
            if accept(prefix):
                return True
        except Exception:  # a plugin's check must not turn bad input into a crash
            continue
    return False
