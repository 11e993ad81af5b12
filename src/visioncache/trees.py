"""Array trees: the values visioncache stores, and the one walker every tree operation uses.

A tree is an array leaf (numpy, torch, mlx: anything with an integer ``nbytes``), bytes, a str, a
plain scalar, or a tuple / list / dict / dataclass of trees. `fold` is the one walker: sizing,
container copies, token counts, device placement, compaction and serialisation
(`visioncache.tiers.serialization`) are all folds, so they agree on what a container and a leaf are
(docs/design.md, principle 3). A bound in bytes means what it says whatever the framework.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from decimal import Decimal
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from visioncache.errors import ConfigurationError, describe_input

__all__ = [
    "MAX_BYTE_SIZE",
    "Container",
    "Prepared",
    "compact",
    "copy_containers",
    "fold",
    "leaf_device",
    "materialise",
    "parse_byte_size",
    "place_on",
    "prepare",
    "token_count",
    "tree_map",
    "tree_nbytes",
]

_T = TypeVar("_T")
_SCALARS = (type(None), bool, int, float, complex, str)
_LEAVES = (*_SCALARS, bytes, bytearray, memoryview)
_DECIMAL_UNITS = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_BINARY_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_UNITS = {"": 1, "b": 1, **_DECIMAL_UNITS, **_BINARY_UNITS, **{u[0]: n for u, n in _BINARY_UNITS.items()}}
MAX_BYTE_SIZE = 2**63 - 1  # SQLite's largest integer: a larger disk budget fails every write
_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class Container(Enum):
    """The kinds of container a tree may hold; anything else is a leaf."""

    LIST = "list"
    TUPLE = "tuple"
    NAMEDTUPLE = "namedtuple"
    DICT = "dict"  # dict and other mappings (transformers' BatchFeature, ModelOutput)
    DATACLASS = "dataclass"


_KINDS: dict[type, Container | None] = {}  # memo by exact type: ABC checks cost a microsecond


def container_kind(value: object) -> Container | None:
    """The container kind of ``value``, or None for a leaf."""
    kind_of = type(value)
    try:
        return _KINDS[kind_of]
    except KeyError:
        kind = _KINDS[kind_of] = _classify(value)
        return kind


def _classify(value: object) -> Container | None:
    if isinstance(value, _LEAVES):
        return None
    if isinstance(value, list):
        return Container.LIST
    if isinstance(value, tuple):
        return Container.NAMEDTUPLE if hasattr(value, "_fields") else Container.TUPLE
    if isinstance(value, Mapping):
        return Container.DICT
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return Container.DATACLASS
    return None


def children(value: object, kind: Container) -> list[tuple[Any, Any]]:
    """(name, child) pairs of a container, in order (list index, dict key, field name)."""
    if kind is Container.DICT:
        assert isinstance(value, Mapping)
        return list(value.items())
    if kind is Container.DATACLASS:
        return [(field.name, getattr(value, field.name)) for field in dataclasses.fields(value)]  # type: ignore[arg-type]
    assert isinstance(value, list | tuple)
    return list(enumerate(value))


def fold(
    value: Any,
    leaf: Callable[[Any], _T],
    node: Callable[[Any, Container, list[tuple[Any, _T]]], _T],
    *,
    max_depth: int = 64,
) -> _T:
    """Reduce a tree bottom-up: ``leaf(x)`` for each leaf, ``node(original, kind, [(name,
    result)])`` for each container. Deeper than ``max_depth`` raises RecursionError (a cycle)."""

    def walk(item: Any, depth: int) -> _T:
        kind = container_kind(item)
        if kind is None:
            return leaf(item)
        if depth >= max_depth:
            raise RecursionError(f"tree deeper than {max_depth} levels (a cycle?)")
        if kind is Container.DICT:
            items = [(name, walk(child, depth + 1)) for name, child in item.items()]
        elif kind is Container.DATACLASS:
            items = [(name, walk(child, depth + 1)) for name, child in children(item, kind)]
        else:
            items = [(index, walk(child, depth + 1)) for index, child in enumerate(item)]
        return node(item, kind, items)

    return walk(value, 0)


def rebuild(original: Any, kind: Container, items: list[tuple[Any, Any]]) -> Any:
    """A new container of ``original``'s type holding ``items`` (a `fold` node for maps)."""
    values = [item for _, item in items]
    if kind is Container.LIST:
        return values
    if kind is Container.TUPLE:
        return tuple(values)
    if kind is Container.NAMEDTUPLE:
        return type(original)(*values)
    if kind is Container.DATACLASS:
        return dataclasses.replace(
            original, **{name: item for name, item in items if _is_init(original, name)}
        )
    if type(original) is dict:
        return dict(items)
    copied = copy.copy(original)  # BatchFeature / ModelOutput keep their type
    for name, item in items:
        copied[name] = item
    return copied


def _is_init(instance: Any, name: str) -> bool:
    return any(field.name == name and field.init for field in dataclasses.fields(instance))


def tree_map(value: Any, function: Callable[[Any], Any]) -> Any:
    """A tree of the same shape with every leaf replaced by ``function(leaf)``."""
    return fold(value, function, rebuild)


def _leaf_nbytes(value: object) -> int:
    if isinstance(value, bytes | bytearray | str):
        return len(value)
    if isinstance(value, _SCALARS):
        return 0
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):  # numpy, torch, mlx arrays and memoryview
        return nbytes
    # An unknown leaf still takes memory; count what Python reports rather than nothing.
    return sys.getsizeof(value)


def tree_nbytes(value: object) -> int:
    """Bytes held by a tree: the sum of its leaves' ``nbytes`` (len for bytes and str)."""
    if container_kind(value) is None:  # the common case: one array
        return _leaf_nbytes(value)
    return fold(value, _leaf_nbytes, lambda _original, _kind, items: sum(size for _, size in items))


def copy_containers(value: Any) -> Any:
    """A copy of the tree's containers; leaves (arrays, scalars) are shared.

    Used where the reference aliased a caller's dict (docs/reference-api.md, defect 7): a consumer
    mutating the copy cannot change the cached entry, and no array memory is duplicated.
    """
    if type(value) is dict and not any(container_kind(item) for item in value.values()):
        return dict(value)  # the common case, a flat dict of leaves, in one step
    return tree_map(value, lambda leaf: leaf)


def token_count(value: Any) -> int | None:
    """The first dimension of the first array in a tree (depth-first, in container order)."""

    def leaf(item: Any) -> int | None:
        shape = getattr(item, "shape", None)
        return int(shape[0]) if shape is not None and len(shape) else None

    def node(_original: Any, _kind: Container, items: list[tuple[Any, int | None]]) -> int | None:
        return next((count for _, count in items if count is not None), None)

    return fold(value, leaf, node)


def _torch() -> Any:
    return sys.modules.get("torch")


def _is_torch(value: object) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def materialise(value: _T) -> _T:
    """``value`` itself, with every mlx array leaf evaluated now, on the calling thread.

    Why: an mlx array is lazy, and MLX runs its pending work only on a thread that holds the
    stream the work was built on ("There is no Stream(cpu, 1) in current thread" anywhere else).
    A value handed to another thread (the tier writer, a thread waiting on this one's
    computation, a later hit) must be evaluated by the thread that produced it. Other leaves are
    left as they are; evaluating an evaluated array costs nothing.
    """
    mx = sys.modules.get("mlx.core")
    if mx is None:  # no mlx array can exist in this process
        return value
    arrays: list[Any] = []

    def leaf(item: Any) -> None:
        if isinstance(item, mx.array):
            arrays.append(item)

    fold(value, leaf, lambda _original, _kind, _items: None)
    if arrays:
        mx.eval(arrays)
    return value


class Prepared(NamedTuple):
    """A value made ready to store, with what every later step needs to know of it."""

    value: Any  # views copied (`compact`), mlx arrays evaluated (`materialise`), on the device asked
    nbytes: int  # `tree_nbytes` of ``value``
    device: Any | None  # `leaf_device` of ``value``


def prepare(value: Any, device: Any | None = None) -> Prepared:
    """``value`` made ready to store, in one walk: each leaf that views a larger buffer copied,
    mlx leaves evaluated on this thread, torch leaves moved to ``device`` (if given), and the
    result's size and device found on the way — what `compact`, `materialise`, `place_on`,
    `tree_nbytes` and `leaf_device` would each walk the tree for. Containers are rebuilt only
    where a leaf changed; ``value`` itself comes back when none did."""
    mx = sys.modules.get("mlx.core")
    lazy: list[Any] = []
    nbytes = 0
    first_device: list[Any] = []

    def leaf(item: Any) -> tuple[Any, bool]:
        nonlocal nbytes
        original = item
        if _is_torch(item):
            if device is not None and item.device != device:
                item = item.to(device)
            elif not _owns_its_memory(item):
                item = item.clone()
            if not first_device:
                first_device.append(item.device)
        elif mx is not None and isinstance(item, mx.array):
            lazy.append(item)
        elif not _owns_its_memory(item):
            item = _copy_leaf(item)
        nbytes += _leaf_nbytes(item)
        return item, item is not original

    def node(original: Any, kind: Container, items: list[tuple[Any, tuple[Any, bool]]]) -> tuple[Any, bool]:
        if not any(changed for _, (_, changed) in items):
            return original, False
        return rebuild(original, kind, [(name, item) for name, (item, _) in items]), True

    prepared, _ = fold(value, leaf, node)
    if lazy:
        assert mx is not None
        mx.eval(lazy)
    return Prepared(prepared, nbytes, first_device[0] if first_device else None)


def leaf_device(value: Any) -> Any | None:
    """The torch device of the tree's first torch tensor, or None."""

    def leaf(item: Any) -> Any | None:
        return item.device if _is_torch(item) else None

    def node(_original: Any, _kind: Container, items: list[tuple[Any, Any]]) -> Any | None:
        return next((device for _, device in items if device is not None), None)

    return fold(value, leaf, node)


def place_on(value: Any, device: Any) -> Any:
    """The tree with its torch tensors moved to ``device`` (other leaves unchanged)."""
    return tree_map(value, lambda item: item.to(device) if _is_torch(item) else item)


def _owns_its_memory(item: Any) -> bool:
    if _is_torch(item):
        if item.layout != _torch().strided:
            return True  # sparse layouts: sized (and refused) elsewhere
        return bool(item.untyped_storage().nbytes() <= item.nbytes)
    base = getattr(item, "base", None)
    if type(item).__module__ == "numpy" and base is not None:
        return bool(_buffer_nbytes(base) <= item.nbytes)
    return True


def _buffer_nbytes(buffer: Any) -> int:
    """Bytes an array's base holds: its ``nbytes``, or the size of a plain buffer (bytes,
    bytearray, mmap), which has none: ``np.frombuffer`` over a whole payload keeps it all alive."""
    nbytes = getattr(buffer, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    try:
        with memoryview(buffer) as view:
            return view.nbytes
    except TypeError:
        return 0


def compact(value: Any) -> Any:
    """The tree with every numpy/torch leaf that views a larger buffer replaced by a copy.

    Why: a per-image slice of a batch output keeps the whole batch alive; a byte budget that
    counts only the slice would not bound memory. Returns ``value`` itself when nothing is a view.
    """
    if fold(value, _owns_its_memory, lambda _original, _kind, items: all(ok for _, ok in items)):
        return value
    return tree_map(value, lambda item: item if _owns_its_memory(item) else _copy_leaf(item))


def _copy_leaf(item: Any) -> Any:
    return item.clone() if _is_torch(item) else item.copy()


def parse_byte_size(value: int | str | None, *, name: str = "size") -> int | None:
    """Parse ``1048576``, ``"512MiB"``, ``"2GiB"``, ``"1.5GB"`` into bytes; None stays None.

    Binary units (KiB, MiB, GiB, TiB and the short K, M, G, T) are powers of 1024; decimal units
    (kB, MB, GB, TB) are powers of 1000. A size is at most `MAX_BYTE_SIZE` (what SQLite, and so a
    disk tier, can count); more raises `ConfigurationError`, as a negative one does.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigurationError(f"{name} must be an int, a string like '2GiB', or None; got {value!r}")
    if isinstance(value, int):
        nbytes = value
    else:
        match = _SIZE_PATTERN.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ConfigurationError(f"{name}: cannot parse {value!r} as a byte size (e.g. '512MiB', '2GiB')")
        nbytes = int(Decimal(match.group(1)) * _UNITS[unit])  # exact: no float overflow
    if not 0 <= nbytes <= MAX_BYTE_SIZE:
        shown = (
            describe_input(value) if isinstance(value, str) or value.bit_length() < 128 else "a larger int"
        )
        raise ConfigurationError(
            f"{name}: expected a byte size from 0 to 8 EiB (2**63 - 1 bytes), got {shown}"
        )
    return nbytes
