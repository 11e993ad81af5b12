"""Array trees to bytes and back, for shared tiers: safetensors + a JSON skeleton, never pickle.

A blob is ``MAGIC`` (8 bytes: the format and its version), a 32-byte digest, then a standard
safetensors file (`visioncache.tiers.tensor_file`) whose tensors are the tree's arrays (numpy,
torch, mlx, and bytes leaves as uint8) and whose ``__metadata__`` holds the format tag and version,
how it is signed, and the JSON skeleton (containers, scalars, and for each array its kind and exact dtype).
Guarantees:

- **verified before it is parsed**: the digest covers the format, a caller-given ``context`` (the
  key) and every byte of the safetensors file; it is checked first, over the blob in place, and
  nothing of a blob whose digest does not match is parsed. It is blake3 without a secret and
  HMAC-SHA256 with one. A truncated or altered blob, one copied under another key, another format
  version's, or one whose verified content is still malformed (anyone who can write to an unsigned
  tier can make a valid blake3 digest: say, a header of 200 KB of nested ``[``) raises
  `CorruptEntryError`, never anything else. With a ``secret``, a blob that does not verify raises
  `UnverifiableEntryError` (a `CorruptEntryError` that tiers must not delete: it may be another
  fleet's, mid-rotation), and only a blob this fleet signed is ever parsed;
- dtype-exact round trips, bfloat16 and float8 included (stored as their bit patterns), and each
  array comes back as the kind it went in as (numpy -> numpy, torch -> torch, mlx -> mlx). Torch
  tensors come back on the CPU, detached; arrays come back writable and share no memory with the
  blob. Only dataclasses registered by name (the `visioncache.entries` ones) are ever constructed;
- a tree holding anything else raises `UnserializableValueError` before any bytes are produced.

The arrays' bytes are copied once each way: into the blob (joined with the header and digest in
one pass, hashed in place before) and out of it (each array read from the blob in place).
Changing this layout changes ``MAGIC`` and `visioncache.identity.KEY_FORMAT_VERSION`, so two
versions of visioncache sharing a tier never read (and delete) each other's entries.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np
from blake3 import blake3

from visioncache import entries
from visioncache.errors import (
    ConfigurationError,
    CorruptEntryError,
    UnserializableValueError,
    UnverifiableEntryError,
)
from visioncache.identity.hasher import frame
from visioncache.tiers import tensor_file
from visioncache.trees import Container, fold

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MAGIC",
    "Flat",
    "dumps",
    "flatten",
    "loads",
    "pack",
    "register_dataclass",
]

FORMAT = "visioncache.tree"
FORMAT_VERSION = 2
MAGIC = b"vctree\x00" + bytes([FORMAT_VERSION])
_DIGEST_BYTES = 32  # blake3's and HMAC-SHA256's
_PREFIX = len(MAGIC) + _DIGEST_BYTES
_MAX_DEPTH = 64  # a deeper tree is almost surely a cycle; refuse it rather than overflow the stack
_INTEGERS = [f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)]
_NUMPY_DTYPES = frozenset(["bool", *_INTEGERS, "float16", "float32", "float64", "complex64"])
# Dtypes numpy lacks travel as their bit patterns; the skeleton records the real dtype.
_BIT_PATTERNS = {"bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}
_DATACLASSES: dict[str, type[Any]] = {}
# What a well-formed digest can still hide in content anyone can sign with blake3.
_MALFORMED = (KeyError, TypeError, ValueError, IndexError, OverflowError, RecursionError)


def register_dataclass(cls: type[Any]) -> type[Any]:
    """Allow a dataclass to be stored and rebuilt, by its class name (usable as a decorator)."""
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        raise ConfigurationError(f"{cls!r} is not a dataclass type")
    _DATACLASSES[cls.__name__] = cls
    return cls


for _entry_class in (entries.PixelCacheEntry, entries.PixelOnlyCacheEntry, entries.EncodingCacheEntry):
    register_dataclass(_entry_class)


class Flat(NamedTuple):
    """A tree taken apart for serialisation: its JSON skeleton and its arrays (host numpy)."""

    skeleton: str
    arrays: dict[str, np.ndarray[Any, Any]]


def flatten(tree: object, *, snapshot: bool = False) -> Flat:
    """``tree`` taken apart, in one walk. With ``snapshot``, every array owns fresh host memory
    (a copy of the leaf's data, made now): what a writer thread serialises later can no longer
    change with the caller's value. Raises `UnserializableValueError` for anything a blob cannot
    hold, before any bytes are produced."""
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    skeleton = json.dumps(_encode(tree, arrays, snapshot), separators=(",", ":"))
    return Flat(skeleton, arrays)


def pack(flat: Flat, *, secret: bytes | None = None, context: str = "") -> bytes:
    """The blob of a flattened tree: its arrays' bytes hashed in place, then joined once."""
    metadata = {
        "format": FORMAT,
        "version": str(FORMAT_VERSION),
        "auth": _auth(secret),
        "skeleton": flat.skeleton,
    }
    parts = tensor_file.pack(flat.arrays, metadata)
    return b"".join([MAGIC, _digest(secret, context, parts), *parts])


def dumps(tree: object, *, secret: bytes | None = None, context: str = "") -> bytes:
    """Serialise ``tree``; ``secret`` signs it with HMAC-SHA256, ``context`` (the key) is bound in."""
    return pack(flatten(tree), secret=secret, context=context)


def loads(blob: bytes, *, secret: bytes | None = None, context: str = "") -> Any:
    """The tree in ``blob``; raises `CorruptEntryError` unless it is intact, current and authentic
    (`UnverifiableEntryError` when ``secret`` is given and it does not verify)."""
    if not isinstance(blob, bytes) or len(blob) < _PREFIX:
        raise CorruptEntryError("blob too short")
    if blob[: len(MAGIC)] != MAGIC:
        raise CorruptEntryError(f"not a visioncache blob of format version {FORMAT_VERSION}")
    file = memoryview(blob)[_PREFIX:]
    if not hmac.compare_digest(_digest(secret, context, [file]), blob[len(MAGIC) : _PREFIX]):
        if secret is not None:  # altered, forged, misplaced or signed with another secret
            raise UnverifiableEntryError(
                "HMAC mismatch: altered, forged, misplaced or signed with another secret"
            )
        raise CorruptEntryError("digest mismatch: the blob was altered or stored under another key")
    try:
        metadata, arrays = tensor_file.unpack(file)
        if metadata.get("format") != FORMAT or metadata.get("version") != str(FORMAT_VERSION):
            raise ValueError(f"format {metadata.get('format')!r} version {metadata.get('version')!r}")
        if metadata.get("auth") != _auth(secret):  # verified: only a forger's own unsigned blob
            raise ValueError(f"signed {metadata.get('auth')!r}, verified as {_auth(secret)!r}")
        return _decode(json.loads(metadata["skeleton"]), arrays, 0)
    except _MALFORMED as error:
        raise CorruptEntryError(f"malformed content: {error!r}"[:300]) from None


def _auth(secret: bytes | None) -> str:
    """How a blob is signed, as its metadata says (informational: the digest decides)."""
    return "none" if secret is None else "hmac-sha256"


def _digest(secret: bytes | None, context: str, parts: Iterable[Any]) -> bytes:
    if secret is not None and (not isinstance(secret, bytes) or not secret):
        raise ConfigurationError("the HMAC secret must be non-empty bytes")
    hasher: Any = hmac.new(secret, digestmod="sha256") if secret is not None else blake3()
    hasher.update(frame(MAGIC) + frame(context.encode("utf-8", "surrogatepass")))
    for part in parts:
        hasher.update(part)
    digest: bytes = hasher.digest()
    return digest


def _encode(value: object, arrays: dict[str, np.ndarray[Any, Any]], snapshot: bool) -> Any:
    """The JSON skeleton of ``value`` (a `trees.fold`); its arrays are added to ``arrays``."""

    def leaf(item: Any) -> Any:
        if item is None or isinstance(item, bool | int | float | str):
            return item
        if isinstance(item, bytearray | memoryview):
            item = bytes(item)  # a copy: its own memory
        if isinstance(item, bytes):  # immutable: its memory can be shared
            return _add_array(arrays, np.frombuffer(item, dtype=np.uint8), "bytes", "uint8", fresh=True)
        kind, array, dtype, fresh = _as_numpy(item)
        return _add_array(arrays, array, kind, dtype, fresh=fresh or not snapshot)

    def node(original: Any, kind: Container, items: list[tuple[Any, Any]]) -> Any:
        if kind is Container.LIST:
            return [item for _, item in items]
        if kind is Container.TUPLE:
            return {"t": "tuple", "items": [item for _, item in items]}
        if kind is Container.DICT and type(original) is dict:
            if not all(isinstance(name, str) for name, _ in items):
                raise UnserializableValueError("dict keys must all be str")
            return {"t": "dict", "items": dict(items)}
        if kind is Container.DATACLASS:
            name = type(original).__name__
            if _DATACLASSES.get(name) is not type(original):
                raise UnserializableValueError(f"dataclass {name} is not registered for serialisation")
            init_names = {field.name for field in dataclasses.fields(original) if field.init}
            # init=False fields are derived in __post_init__
            return {"t": "dataclass", "name": name, "fields": {n: v for n, v in items if n in init_names}}
        # a namedtuple or a dict subclass would come back as a plain container: refuse it
        raise UnserializableValueError(f"cannot serialise a {type(original).__qualname__} container")

    try:
        return fold(value, leaf, node, max_depth=_MAX_DEPTH)
    except RecursionError:
        raise UnserializableValueError(f"tree deeper than {_MAX_DEPTH} levels (a cycle?)") from None


def _add_array(
    arrays: dict[str, np.ndarray[Any, Any]],
    array: np.ndarray[Any, Any],
    kind: str,
    dtype: str,
    *,
    fresh: bool,
) -> dict[str, Any]:
    """Add ``array`` C-contiguous, copied unless it is ``fresh`` (memory nobody else holds) and
    contiguous already."""
    name = str(len(arrays))
    # not np.ascontiguousarray: it turns a 0-d array into a 1-d one
    arrays[name] = array if fresh and array.flags.c_contiguous else array.copy(order="C")
    return {"t": "array", "kind": kind, "dtype": dtype, "tensor": name}


def _as_numpy(value: object) -> tuple[str, np.ndarray[Any, Any], str, bool]:
    """(kind, a numpy view or copy of the data, the exact dtype name, whether it is a copy: memory
    the leaf does not share) for an array leaf."""
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        kind = "numpy" if isinstance(value, np.ndarray) else "numpy-scalar"
        if array.dtype.name not in _NUMPY_DTYPES:
            raise UnserializableValueError(f"numpy dtype {array.dtype} is not supported")
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        return (
            kind,
            little,
            array.dtype.name,
            kind == "numpy-scalar" or not np.may_share_memory(little, value),
        )
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise UnserializableValueError(f"torch layout {value.layout} is not supported")
        dtype = str(value.dtype).removeprefix("torch.")
        tensor = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
        fresh = tensor.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()
        if dtype in _BIT_PATTERNS:
            tensor = tensor.view(getattr(torch, _BIT_PATTERNS[dtype]))
        elif dtype not in _NUMPY_DTYPES:
            raise UnserializableValueError(f"torch dtype {value.dtype} is not supported")
        return "torch", tensor.numpy(), dtype, fresh
    mlx_core = sys.modules.get("mlx.core")
    if mlx_core is not None and isinstance(value, mlx_core.array):
        dtype = str(value.dtype).removeprefix("mlx.core.").replace("bool_", "bool")
        if dtype in _BIT_PATTERNS:  # np.array copies: fresh memory
            return "mlx", np.array(value.view(getattr(mlx_core, _BIT_PATTERNS[dtype]))), dtype, True
        if dtype not in _NUMPY_DTYPES:
            raise UnserializableValueError(f"mlx dtype {value.dtype} is not supported")
        return "mlx", np.array(value), dtype, True
    raise UnserializableValueError(
        f"cannot serialise an object of type {type(value).__module__}.{type(value).__qualname__}"
    )


def _decode(node: Any, arrays: dict[str, np.ndarray[Any, Any]], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError("skeleton too deep")
    if node is None or isinstance(node, bool | int | float | str):
        return node
    if isinstance(node, list):
        return [_decode(item, arrays, depth + 1) for item in node]
    tag = node["t"]
    if tag == "tuple":
        return tuple(_decode(item, arrays, depth + 1) for item in node["items"])
    if tag == "dict":
        return {key: _decode(item, arrays, depth + 1) for key, item in node["items"].items()}
    if tag == "dataclass":
        cls = _DATACLASSES[node["name"]]  # KeyError -> corrupt: never build an unknown class
        init_names = {field.name for field in dataclasses.fields(cls) if field.init}
        fields = node["fields"]
        if set(fields) != init_names:
            raise ValueError(f"fields of {node['name']} do not match: {sorted(fields)}")
        return cls(**{name: _decode(item, arrays, depth + 1) for name, item in fields.items()})
    if tag == "array":
        return _ARRAY_BUILDERS[node["kind"]](arrays[node["tensor"]], node["dtype"])
    raise ValueError(f"unknown node tag {tag!r}")


def _check_storage(array: np.ndarray[Any, Any], dtype: str) -> None:
    if array.dtype.name != _BIT_PATTERNS.get(dtype, dtype):
        raise ValueError(f"tensor stored as {array.dtype}, skeleton says {dtype}")


def _build_numpy(array: np.ndarray[Any, Any], dtype: str) -> Any:
    _check_storage(array, dtype)
    return array


def _build_numpy_scalar(array: np.ndarray[Any, Any], dtype: str) -> Any:
    _check_storage(array, dtype)
    return array[()]


def _build_bytes(array: np.ndarray[Any, Any], dtype: str) -> Any:
    _check_storage(array, "uint8")
    return array.tobytes()


def _build_torch(array: np.ndarray[Any, Any], dtype: str) -> Any:
    import torch

    _check_storage(array, dtype)
    tensor = torch.from_numpy(array)  # the array owns fresh memory: no copy needed
    return tensor.view(getattr(torch, dtype)) if dtype in _BIT_PATTERNS else tensor


def _build_mlx(array: np.ndarray[Any, Any], dtype: str) -> Any:
    import mlx.core as mx

    _check_storage(array, dtype)
    if dtype in _BIT_PATTERNS:
        return mx.array(array).view(getattr(mx, dtype))
    return mx.array(array, dtype=getattr(mx, dtype.replace("bool", "bool_")))  # float64 stays


_ARRAY_BUILDERS: dict[str, Callable[[np.ndarray[Any, Any], str], Any]] = {
    "numpy": _build_numpy,
    "numpy-scalar": _build_numpy_scalar,
    "bytes": _build_bytes,
    "torch": _build_torch,
    "mlx": _build_mlx,
}
