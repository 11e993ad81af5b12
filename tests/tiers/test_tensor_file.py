"""The safetensors layout written and read over buffers: the safetensors package agrees, both ways,
and a malformed file is a `ValueError`, never anything else."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from visioncache.tiers import tensor_file

ARRAYS = {
    "0": np.arange(12, dtype=np.float32).reshape(3, 4),
    "1": np.array([True, False, True]),
    "2": np.arange(5, dtype=np.int64),
    "3": np.zeros((0, 3), np.float16),
    "4": np.array(7, np.uint8),
    "5": (np.arange(4) + 1j).astype(np.complex64),
    "6": np.arange(6, dtype=np.uint16),
}


def packed(arrays: dict[str, np.ndarray[Any, Any]], metadata: dict[str, str]) -> bytes:
    return b"".join(tensor_file.pack(arrays, metadata))


def test_the_safetensors_package_reads_what_pack_writes() -> None:
    file = packed(ARRAYS, {"a": "b"})
    loaded = safetensors.numpy.load(file)
    assert set(loaded) == set(ARRAYS)
    for name, array in ARRAYS.items():
        assert loaded[name].dtype == array.dtype and np.array_equal(loaded[name], array)


def test_unpack_reads_what_the_safetensors_package_writes() -> None:
    file = safetensors.numpy.save(ARRAYS, metadata={"a": "b"})
    metadata, arrays = tensor_file.unpack(memoryview(file))
    assert metadata == {"a": "b"} and set(arrays) == set(ARRAYS)
    for name, array in ARRAYS.items():
        assert arrays[name].dtype == array.dtype and np.array_equal(arrays[name], array)
        assert arrays[name].flags.writeable and arrays[name].flags.owndata


def test_unpack_reads_a_file_inside_a_larger_buffer_in_place() -> None:
    blob = b"prefix.." + packed(ARRAYS, {})
    _, arrays = tensor_file.unpack(memoryview(blob)[8:])
    assert np.array_equal(arrays["0"], ARRAYS["0"])


def header_file(header: Any, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


MALFORMED = {
    "empty": b"",
    "short": b"\x01\x00",
    "length past the end": struct.pack("<Q", 100) + b"{}",
    "not json": struct.pack("<Q", 3) + b"{{{",
    "not an object": header_file([1, 2]),
    "metadata not strings": header_file({"__metadata__": {"a": 1}}),
    "unknown dtype": header_file({"x": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, bytes(16)),
    "negative shape": header_file({"x": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}, bytes(1)),
    "bool shape": header_file({"x": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, bytes(1)),
    "offsets past the data": header_file(
        {"x": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, bytes(2)
    ),
    "size mismatch": header_file({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, bytes(4)),
    "reversed offsets": header_file({"x": {"dtype": "U8", "shape": [0], "data_offsets": [2, 1]}}, bytes(2)),
    "entry not an object": header_file({"x": 3}),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_files_raise_value_error(name: str) -> None:
    with pytest.raises(ValueError):
        tensor_file.unpack(memoryview(MALFORMED[name]))


def test_absurd_nesting_raises_recursion_error_not_a_crash() -> None:
    header = b"[" * 200_000
    with pytest.raises(RecursionError):
        tensor_file.unpack(memoryview(struct.pack("<Q", len(header)) + header))
