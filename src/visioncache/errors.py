"""Typed errors: every failure a caller can cause is a `VisionCacheError`.

Errors about a wrong value subclass `ValueError`, errors about a wrong type subclass `TypeError`,
so engines that already catch those keep working. Each is raised before any cache state changes.
"""

from __future__ import annotations

import os

__all__ = [
    "ConfigurationError",
    "CorruptEntryError",
    "EncoderOutputError",
    "ImageTooLargeError",
    "InvalidArgumentError",
    "InvalidImageError",
    "MissingExtraError",
    "PinMismatchError",
    "PlaceholderMismatchError",
    "UnserializableValueError",
    "UnsupportedImageTypeError",
    "UnsupportedInputTypeError",
    "UnsupportedRuntimeError",
    "UnverifiableEntryError",
    "VisionCacheError",
    "describe_input",
    "describe_path",
]

_PREVIEW_CHARS = 80
_PATH_MAX = 4096


class VisionCacheError(Exception):
    """Base class of every error visioncache raises on purpose."""


class InvalidArgumentError(VisionCacheError, ValueError):
    """The caller passed an argument with the right type but a wrong value (e.g. an ``expect=``
    list whose length does not match the images). The caller's mistake, not the encoder's."""


class InvalidImageError(VisionCacheError, ValueError):
    """An image input has the right type but identifies no content.

    Examples: a string that is no existing file, URL, ``data:`` URL or base64 of media; corrupt
    base64; empty content; a path that is not a regular file (a directory, a FIFO, a device).
    """


class ImageTooLargeError(InvalidImageError):
    """An image input is larger than the configured ``max_image_bytes``."""


class UnsupportedInputTypeError(VisionCacheError, TypeError):
    """An argument has a type visioncache does not accept (e.g. a prompt that is not a str)."""


class UnsupportedImageTypeError(UnsupportedInputTypeError):
    """An image input (or an ``images`` argument) has a type visioncache does not accept."""


class PlaceholderMismatchError(VisionCacheError, ValueError):
    """A prompt's image placeholders do not match the number of images sent with it."""


class ConfigurationError(VisionCacheError, ValueError):
    """A constructor argument or setting is invalid (e.g. a byte size such as ``"2 parsecs"``)."""


class MissingExtraError(VisionCacheError, ImportError):
    """An optional dependency is not installed; the message names the ``pip install
    'visioncache[extra]'`` that brings it (raised by `visioncache.extras.requires`)."""


class EncoderOutputError(VisionCacheError, ValueError):
    """An ``encode_fn`` / ``preprocess_fn`` returned a result that cannot be matched to its inputs."""


class CorruptEntryError(VisionCacheError, ValueError):
    """A stored blob is truncated, altered, forged (HMAC mismatch) or of an unknown format version.

    Tiers treat it as a miss: the entry is deleted and counted, never returned.
    """


class PinMismatchError(VisionCacheError, RuntimeError):
    """``unpin`` was called for a key that holds no pin (an unpin without its matching pin)."""


class UnverifiableEntryError(CorruptEntryError):
    """A stored blob is intact but signed with a secret this reader does not hold (or not signed
    while this reader requires a signature). Treated as a miss, but never deleted: another fleet,
    mid-rotation, may still read it."""


class UnsupportedRuntimeError(VisionCacheError, RuntimeError):
    """The interpreter lacks what visioncache relies on (e.g. free-threaded CPython with the GIL
    disabled: see docs/guarantees.md, "Threads")."""


class UnserializableValueError(VisionCacheError, TypeError):
    """A value holds something the tier serialisation cannot store (e.g. an arbitrary object)."""


def describe_input(value: object, limit: int = _PREVIEW_CHARS) -> str:
    """A short, safe description of an input for error messages (long strings are truncated)."""
    if isinstance(value, str):
        text = value if len(value) <= limit else value[:limit] + "..."
        return f"{text!r} (str, {len(value)} chars)"
    if isinstance(value, bytes | bytearray | memoryview):
        head = bytes(value[:16])
        return f"{type(value).__name__} of {len(value)} bytes starting {head!r}"
    return f"object of type {type(value).__module__}.{type(value).__qualname__}"


def describe_path(value: object) -> str:
    """`describe_input` for a message about a file: a path (a str with a separator, at most
    PATH_MAX long) is named whole, so a missing file under a deep directory is recognisable."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str) and os.sep in value and len(value) <= _PATH_MAX:
        return describe_input(value, _PATH_MAX)
    return describe_input(value)
