"""Serialisation of array trees: exact round trips per framework, and rejection of bad blobs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from tests.support.blobs import forged_tree
from tests.support.optional import mx, needs_mlx, needs_torch, torch
from visioncache.entries import EncodingCacheEntry, PixelCacheEntry, PixelOnlyCacheEntry
from visioncache.errors import CorruptEntryError, UnserializableValueError
from visioncache.tiers import serialization
from visioncache.tiers.serialization import dumps, loads

NUMPY_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
]
TORCH_DTYPES = (
    []
    if torch is None
    else [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ]
)
MLX_DTYPES = (
    []
    if mx is None
    else [mx.bool_, mx.uint8, mx.int32, mx.int64, mx.float16, mx.bfloat16, mx.float32, mx.float64]
)


def round_trip(tree: Any, **options: Any) -> Any:
    return loads(dumps(tree, **options), **options)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", [(), (0, 3), (2, 3, 5)])
def test_numpy_round_trip(dtype: str, shape: tuple[int, ...]) -> None:
    array = (np.arange(int(np.prod(shape))) * 7 % 5).astype(dtype).reshape(shape)
    result = round_trip(array)
    assert type(result) is np.ndarray
    assert (result.dtype, result.shape) == (array.dtype, array.shape)
    assert result.tobytes() == array.tobytes()
    assert result.flags.writeable


def test_numpy_non_contiguous_and_nan_exact() -> None:
    array = np.array([[1.0, np.nan], [-0.0, np.inf]], dtype=np.float32).T
    result = round_trip(array)
    assert result.tobytes() == np.ascontiguousarray(array).tobytes()  # bit-exact, NaN and -0.0


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@needs_torch
def test_torch_round_trip(dtype: torch.dtype) -> None:
    tensor = torch.linspace(-3, 3, 12).reshape(3, 4).to(dtype)
    result = round_trip(tensor)
    assert type(result) is torch.Tensor
    assert (result.dtype, result.shape) == (tensor.dtype, tensor.shape)
    bits = torch.uint8 if tensor.element_size() == 1 else getattr(torch, f"int{8 * tensor.element_size()}")
    assert torch.equal(result.view(bits), tensor.view(bits))


@needs_torch
def test_torch_view_requires_grad_and_scalar() -> None:
    base = torch.randn(4, 4, requires_grad=True)
    tree = {"view": base.T[1:], "scalar": torch.tensor(2.5, dtype=torch.bfloat16)}
    result = round_trip(tree)
    assert torch.equal(result["view"], base.detach().T[1:])
    assert not result["view"].requires_grad
    assert result["scalar"].shape == () and result["scalar"].dtype == torch.bfloat16
    assert result["scalar"].item() == 2.5


@pytest.mark.parametrize("dtype", MLX_DTYPES, ids=str)
@needs_mlx
def test_mlx_round_trip(dtype: Any) -> None:
    array = mx.array(np.linspace(-2, 2, 6).reshape(2, 3)).astype(dtype)
    result = round_trip(array)
    assert type(result) is mx.array
    assert (result.dtype, result.shape) == (array.dtype, array.shape)
    assert mx.array_equal(result, array).item()


@needs_mlx
def test_mlx_bfloat16_bits_exact() -> None:
    array = mx.array([1.0 / 3, -1e-3, 65504.0, 3.0e38], dtype=mx.bfloat16)
    result = round_trip(array)
    assert np.array_equal(np.array(result.view(mx.uint16)), np.array(array.view(mx.uint16)))


@needs_torch
@needs_mlx
def test_entry_dataclasses_round_trip() -> None:
    pixel = PixelCacheEntry(
        pixel_values=np.ones((4, 3), np.float32),
        input_ids=torch.tensor([[1, 2, 3]]),
        attention_mask=None,
        image_grid_thw=mx.array([[1, 2, 2]]),
        extra_kwargs={"video": None, "sizes": (1, 2)},
        processing_time=0.125,
    )
    pixel_only = PixelOnlyCacheEntry(pixel_values=torch.zeros(2, 2, dtype=torch.bfloat16))
    encoding = EncodingCacheEntry(logits=np.zeros(5), first_token=42, logprobs=np.full(5, -1.5))
    result = round_trip([pixel, pixel_only, encoding])
    assert [type(entry) for entry in result] == [PixelCacheEntry, PixelOnlyCacheEntry, EncodingCacheEntry]
    assert np.array_equal(result[0].pixel_values, pixel.pixel_values)
    assert torch.equal(result[0].input_ids, pixel.input_ids)
    assert result[0].attention_mask is None
    assert type(result[0].image_grid_thw) is mx.array
    assert result[0].extra_kwargs == {"video": None, "sizes": (1, 2)}
    assert result[0].processing_time == 0.125
    assert result[1].pixel_values.dtype == torch.bfloat16
    assert result[2].first_token == 42 and result[2].encoding_time == 0.0


def test_nested_tree_keeps_container_types_and_scalars() -> None:
    tree = {
        "tuple": (1, (2.5, "x"), [None, True]),
        "list": [b"raw \x00 bytes", np.float16(1.5), {"t": "not a tag", "items": 3}],
        "empty": {"list": [], "tuple": (), "dict": {}},
        "big": 2**80,
    }
    result = round_trip(tree)
    assert result["tuple"] == (1, (2.5, "x"), [None, True])
    assert result["list"][0] == b"raw \x00 bytes"
    assert isinstance(result["list"][1], np.float16) and result["list"][1] == 1.5
    assert result["list"][2] == {"t": "not a tag", "items": 3}  # a user dict is not a node
    assert result["empty"] == {"list": [], "tuple": (), "dict": {}}
    assert result["big"] == 2**80


@pytest.mark.parametrize(
    "value",
    [
        object(),
        {1: "int key"},
        np.array(["a"], dtype=object),
        {1, 2},
        *([torch.zeros(2).to_sparse()] if torch is not None else []),
    ],
    ids=["object", "int-key", "object-dtype", "set", *(["sparse"] if torch is not None else [])],
)
def test_unsupported_values_raise(value: Any) -> None:
    with pytest.raises(UnserializableValueError):
        dumps({"ok": np.zeros(1), "bad": value})


def test_unregistered_dataclass_and_cycle_raise() -> None:
    from dataclasses import dataclass

    @dataclass
    class PixelCacheEntry:  # same name as a registered class, different type
        pixel_values: Any

    with pytest.raises(UnserializableValueError):
        dumps(PixelCacheEntry(np.zeros(1)))
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(UnserializableValueError):
        dumps(cycle)


BLOB = dumps({"a": np.arange(1000, dtype=np.float32), "b": [1, "two"]}, context="k")


@pytest.mark.parametrize("cut", [0, 1, 7, 8, 50, len(BLOB) // 2, len(BLOB) - 1])
def test_truncated_blob_is_corrupt(cut: int) -> None:
    with pytest.raises(CorruptEntryError):
        loads(BLOB[:cut], context="k")


@pytest.mark.parametrize("position", [len(BLOB) - 1, len(BLOB) - 2000, len(BLOB) - 4000])
def test_flipped_bit_in_array_data_is_corrupt(position: int) -> None:
    damaged = bytearray(BLOB)
    damaged[position] ^= 0x01
    with pytest.raises(CorruptEntryError):
        loads(bytes(damaged), context="k")


def test_edited_skeleton_is_corrupt() -> None:
    edited = BLOB.replace(b'\\"two\\"', b'\\"TWO\\"')
    assert edited != BLOB and len(edited) == len(BLOB)
    with pytest.raises(CorruptEntryError, match="digest"):
        loads(edited, context="k")


def test_blob_under_another_key_is_corrupt() -> None:
    with pytest.raises(CorruptEntryError):
        loads(BLOB, context="another key")


def test_hmac_mismatches_are_corrupt() -> None:
    signed = dumps([np.ones(3)], secret=b"right", context="k")
    assert np.array_equal(loads(signed, secret=b"right", context="k")[0], np.ones(3))
    with pytest.raises(CorruptEntryError):
        loads(signed, secret=b"wrong", context="k")
    with pytest.raises(CorruptEntryError):
        loads(signed, context="k")  # a signed blob cannot be checked without the secret
    with pytest.raises(CorruptEntryError):
        loads(BLOB, secret=b"right", context="k")  # an unsigned blob is refused when signing is on


def forged(skeleton: Any, version: str = str(serialization.FORMAT_VERSION)) -> bytes:
    """A blob with a valid (unkeyed) digest, as anyone with write access could make it."""
    return forged_tree(skeleton, version=version)


def test_forged_blob_cannot_construct_unregistered_classes() -> None:
    assert loads(forged([1, 2])) == [1, 2]  # the forging helper itself is right
    with pytest.raises(CorruptEntryError):
        loads(forged({"t": "dataclass", "name": "Popen", "fields": {"args": "true"}}))
    with pytest.raises(CorruptEntryError):
        loads(forged({"t": "dataclass", "name": "EncodingCacheEntry", "fields": {"x": 1}}))
    with pytest.raises(CorruptEntryError):
        loads(forged({"t": "array", "kind": "numpy", "dtype": "float32", "tensor": "0"}))


def test_unknown_version_and_foreign_files_are_corrupt() -> None:
    with pytest.raises(CorruptEntryError, match="version"):
        loads(forged([1], version="3"))
    with pytest.raises(CorruptEntryError):
        loads(safetensors.numpy.save({"w": np.zeros(2)}))  # a plain safetensors file
    with pytest.raises(CorruptEntryError):
        loads(b"\x80\x04\x95 pickle-looking garbage")
