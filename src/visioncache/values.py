"""Array trees: the values visioncache stores, their size in bytes, and container-only copies.

A tree is an array (numpy, torch, mlx: anything with an integer ``nbytes``), bytes, a plain scalar,
or a tuple / list / dict / dataclass of trees. Sizing walks the tree and sums the arrays' ``nbytes``,
so a bound in bytes means what it says whatever the framework (DESIGN.md principle 3).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping
from typing import Any

from visioncache.errors import ConfigurationError

__all__ = ["copy_containers", "parse_byte_size", "tree_nbytes"]

_SCALARS = (type(None), bool, int, float, complex)
_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}  # fmt: skip
_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def tree_nbytes(value: object) -> int:
    """Bytes held by a tree: the sum of its arrays' ``nbytes`` (and of bytes-like leaves)."""
    if isinstance(value, _SCALARS):
        return 0
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, str):
        return len(value)
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):  # numpy, torch, mlx arrays and memoryview
        return nbytes
    if isinstance(value, Mapping):  # dict, transformers' BatchFeature / ModelOutput
        return sum(tree_nbytes(item) for item in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return sum(tree_nbytes(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(tree_nbytes(getattr(value, field.name)) for field in dataclasses.fields(value))
    # An unknown leaf still takes memory; count what Python reports rather than nothing.
    return sys.getsizeof(value)


def copy_containers(value: Any) -> Any:
    """A copy of the tree's containers (dicts, lists, tuples); arrays and scalars are shared.

    Used where the reference aliased a caller's dict (defect 7): a consumer mutating the copy
    cannot change the cached entry, and no array memory is duplicated.
    """
    if isinstance(value, dict):
        return {key: copy_containers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_containers(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(copy_containers(item) for item in value)
    return value


def parse_byte_size(value: int | str | None, *, name: str = "size") -> int | None:
    """Parse ``1048576``, ``"512MiB"``, ``"2GiB"``, ``"1.5GB"`` into bytes; None stays None.

    Binary units (KiB, MiB, GiB, TiB and the short K, M, G, T) are powers of 1024; decimal units
    (kB, MB, GB, TB) are powers of 1000.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigurationError(f"{name} must be an int, a string like '2GiB', or None; got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigurationError(f"{name} must be >= 0, got {value}")
        return value
    match = _SIZE_PATTERN.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigurationError(f"{name}: cannot parse {value!r} as a byte size (e.g. '512MiB', '2GiB')")
    return int(float(match.group(1)) * _UNITS[unit])
