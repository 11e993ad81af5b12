"""The safetensors file layout, written and read over buffers: arrays + a string metadata map.

A safetensors file is a little-endian u64 ``N``, an ``N``-byte JSON header (``__metadata__``:
str -> str, and per tensor its dtype code, shape and ``[start, end)`` offsets into the data that
follows), padded with spaces to 8 bytes, then the tensors' bytes. `pack` returns the file as a list
of buffers (the arrays' own memory, not copied: the caller hashes them and joins them once), and
`unpack` reads one from a `memoryview` (a slice of a larger blob, not copied first).

Why not the safetensors package here: its reader takes only a whole ``bytes`` object, so a file
inside a framed blob would be copied once more before its arrays are, and it parses the header
itself, where a tier's blob must be verified before anything in it is parsed
(`visioncache.tiers.serialization`). What this writes, the package reads
(tests/tiers/test_tensor_file.py), and the reverse.

`unpack` trusts nothing: every field is type- and range-checked and a malformed file raises
`ValueError` (or `RecursionError` from the JSON parser for absurd nesting), which the caller turns
into a corrupt entry. Arrays come back as fresh, writable copies.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

__all__ = ["pack", "unpack"]

_DTYPE_CODES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "float16": "F16",
    "uint32": "U32",
    "int32": "I32",
    "float32": "F32",
    "uint64": "U64",
    "int64": "I64",
    "float64": "F64",
    "complex64": "C64",
}
_DTYPES = {code: np.dtype(name).newbyteorder("<") for name, code in _DTYPE_CODES.items()}
_LENGTH = struct.Struct("<Q")


def pack(arrays: dict[str, np.ndarray[Any, Any]], metadata: dict[str, str]) -> list[Any]:
    """The file's buffers, in order: length, header, then each array's bytes. Arrays must be
    C-contiguous and little-endian, of a dtype in the table above; the widest come first, so
    each stays aligned to its item size within the data."""
    names = sorted(arrays, key=lambda name: -arrays[name].dtype.itemsize)  # stable: ties keep order
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in names:
        array = arrays[name]
        header[name] = {
            "dtype": _DTYPE_CODES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8", "surrogatepass")
    text += b" " * (-len(text) % 8)
    return [_LENGTH.pack(len(text)), text, *(arrays[name].reshape(-1).view(np.uint8) for name in names)]


def unpack(file: memoryview) -> tuple[dict[str, str], dict[str, np.ndarray[Any, Any]]]:
    """(metadata, arrays) of the file in ``file``; raises `ValueError` unless it is well formed."""
    if len(file) < _LENGTH.size:
        raise ValueError("too short for a safetensors file")
    (length,) = _LENGTH.unpack_from(file)
    if length > len(file) - _LENGTH.size:
        raise ValueError("truncated inside its header")
    header = json.loads(file[_LENGTH.size : _LENGTH.size + length].tobytes())
    if not isinstance(header, dict):
        raise ValueError("the header is not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise ValueError("the metadata is not a map of strings")
    data = file[_LENGTH.size + length :]
    arrays = {name: _array(name, entry, data) for name, entry in header.items()}
    return metadata, arrays


def _array(name: str, entry: Any, data: memoryview) -> np.ndarray[Any, Any]:
    if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES:
        raise ValueError(f"tensor {name!r}: no known dtype")
    dtype = _DTYPES[entry["dtype"]]
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(_is_count(size) for size in shape):
        raise ValueError(f"tensor {name!r}: malformed shape")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(item) for item in offsets):
        raise ValueError(f"tensor {name!r}: malformed offsets")
    start, end = offsets
    count = math.prod(shape)
    if not start <= end <= len(data) or count * dtype.itemsize != end - start:
        raise ValueError(f"tensor {name!r}: offsets {offsets} do not fit shape {shape} in the data")
    if not count:
        return np.empty(shape, dtype)
    return np.frombuffer(data, dtype, count, start).reshape(shape).copy()


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0
