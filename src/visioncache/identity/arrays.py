"""The digest of an array: its dtype described in full, its shape, and its bytes in C order.

Why in full: ``dtype.str`` names a numeric dtype exactly (``'<f4'``: byte order, kind, item size),
but is ``'|V8'`` for every structured, sub-array or void dtype of 8 bytes, so the
same bytes as any of those had one digest. Numeric dtypes keep ``dtype.str`` (and the digests they
always had); the others are described field by field.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
from blake3 import blake3

from visioncache.errors import InvalidImageError
from visioncache.identity.framing import domain_key, frame

__all__ = ["array_digest", "dtype_description"]

_ARRAY = domain_key("visioncache/image/ndarray/v1")


def dtype_description(dtype: np.dtype[Any]) -> bytes:
    """Everything that gives a dtype's bytes their meaning, as bytes that name only that dtype.

    A numeric dtype is its ``dtype.str``. A structured dtype is its item size and each field's
    name, offset, title and dtype (recursively); a sub-array its base dtype and shape; a plain void
    its item size. These start with a byte no ``dtype.str`` starts with, so they never equal a
    numeric dtype's description.
    """
    if dtype.fields is None and dtype.subdtype is None and dtype.kind != "V":
        return dtype.str.encode()
    if dtype.fields is not None:
        names = dtype.names or ()
        parts = [b"\x00S", struct.pack("<QQ", dtype.itemsize, len(names))]
        for name in names:
            field_dtype, offset, *title = dtype.fields[name]
            parts += [
                frame(name.encode("utf-8", "surrogatepass")),
                struct.pack("<Q", offset),
                frame(repr(title[0]).encode("utf-8", "surrogatepass") if title else b""),
                frame(dtype_description(field_dtype)),
            ]
        return b"".join(parts)
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return b"\x00A" + frame(dtype_description(base)) + struct.pack(f"<Q{len(shape)}Q", len(shape), *shape)
    return b"\x00V" + struct.pack("<Q", dtype.itemsize)


def array_digest(array: np.ndarray[Any, Any], check_size: Callable[[int, object], None]) -> bytes:
    """The 32-byte digest of a non-empty array without objects; ``check_size`` runs first."""
    if array.dtype.hasobject or array.size == 0:
        raise InvalidImageError(f"array image must be non-empty and numeric, got {array.dtype} {array.shape}")
    check_size(array.nbytes, array)
    header = frame(dtype_description(array.dtype)) + struct.pack(f"<Q{array.ndim}Q", array.ndim, *array.shape)
    hasher = blake3(header, key=_ARRAY)
    hasher.update(np.ascontiguousarray(array).view(np.uint8).reshape(-1).data)
    return bytes(hasher.digest())
