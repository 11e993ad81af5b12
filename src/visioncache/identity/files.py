"""Reading a file for its digest: regular files only, never blocking, bounded, streamed.

Why: a path may name a device (``/dev/zero`` never ends), a FIFO (its reader blocks), a file that
grows while it is read, or a video of hundreds of megabytes. So a file is opened without blocking
(O_NONBLOCK: a file replaced by a FIFO since its ``stat`` is refused by ``fstat``, not waited on),
must be a regular file, is checked against the size limit before any byte is read and again as it
is read (never more than ``limit + 1`` bytes), and is hashed in chunks of at most 1 MiB, so memory
stays flat whatever its size.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from blake3 import blake3

from visioncache.errors import InvalidImageError, describe_path

__all__ = ["hash_file", "require_regular_file", "stat_or_reason"]

_OPEN_FLAGS = (
    os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
)
_CHUNK = 1 << 20


def stat_or_reason(path: str) -> os.stat_result | str:
    """The file's status, or why there is none (the exception's name)."""
    try:
        return os.stat(path)
    except (OSError, ValueError) as error:  # ValueError: an embedded NUL character
        return type(error).__name__


def require_regular_file(status: os.stat_result, original: object) -> None:
    """Only regular files are read: a device (``/dev/zero``) never ends, a FIFO blocks its reader."""
    mode = status.st_mode
    if stat.S_ISREG(mode):
        return
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
    )
    kind = next((name for test, name in kinds if test(mode)), "of another kind")
    raise InvalidImageError(f"not a regular file ({kind}): {describe_path(original)}")


def hash_file(
    path: str, key: bytes, limit: int, check_size: Callable[[int, object], None], original: object
) -> tuple[bytes, os.stat_result]:
    """(blake3 digest of the file's bytes under ``key``, the status they were read under).

    ``check_size(bytes, original)`` raises for more than ``limit`` bytes: it runs on the status
    before reading and on the running total while reading (a file that grows, a /proc file).
    """
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except OSError as error:
        raise InvalidImageError(f"cannot open {describe_path(original)}: {error.strerror}") from None
    try:
        status = os.fstat(descriptor)
        require_regular_file(status, original)
        check_size(status.st_size, original)
        hasher = blake3(key=key)
        total = 0
        while chunk := os.read(descriptor, min(_CHUNK, limit + 1 - total)):  # never past limit + 1
            total += len(chunk)
            check_size(total, original)
            hasher.update(chunk)
    except OSError as error:
        raise InvalidImageError(f"cannot read {describe_path(original)}: {error.strerror}") from None
    finally:
        os.close(descriptor)
    if total == 0:
        raise InvalidImageError(f"empty content: {describe_path(original)}")
    return bytes(hasher.digest()), status
