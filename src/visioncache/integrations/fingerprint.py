"""One way to fingerprint a configuration: blake3 over framed parts, for cache namespaces.

Integrations name what shapes a cached value (model config, processor settings, dtype, weights) by
a fingerprint of those parts. Every part is length-framed, so two different lists of parts never
hash the same bytes, and settings are serialised by `stable_json`, so two equal configurations
always give the same fingerprint (no memory addresses, no dict-order dependence).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from blake3 import blake3

from visioncache import forking
from visioncache.identity import frame

__all__ = ["WEIGHT_SUFFIXES", "fingerprint", "stable_json", "weights_digest"]

# Files that hold model weights, in the formats torch, mlx and llama.cpp checkpoints use.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npz", ".gguf")
_weights_memo: dict[tuple[tuple[str, int, int], ...], str] = {}
_weights_lock = forking.lock()  # a leaf: the memo only, never held while hashing


def stable_json(value: object) -> str:
    """``value`` as canonical JSON: keys sorted; a non-JSON leaf is named by its type (``repr``
    could embed a memory address and make two identical configurations differ)."""
    return json.dumps(value, sort_keys=True, default=lambda item: type(item).__qualname__)


def fingerprint(parts: Iterable[str | bytes], *, hex_chars: int = 64) -> str:
    """The hex blake3 digest of ``parts``, each framed (so ``["ab", "c"]`` != ``["a", "bc"]``)."""
    if not 32 <= hex_chars <= 64:
        raise ValueError(f"hex_chars must be in 32..64 (128 to 256 bits), got {hex_chars}")
    hasher = blake3()
    for part in parts:
        hasher.update(frame(part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part))
    return hasher.hexdigest()[:hex_chars]


def weights_digest(
    directory: str | os.PathLike[str], suffixes: tuple[str, ...] = WEIGHT_SUFFIXES
) -> str | None:
    """A digest of every weight file under ``directory`` (relative names and contents), or None
    if it holds none. Random or fine-tuned weights with the same config differ here, where a model
    name or a config would not. Memoised per process by the files' (path, size, mtime_ns), so an
    engine's processes and restarts within one process hash once."""
    root = Path(directory)
    files = (
        sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(suffixes))
        if root.is_dir()
        else []
    )
    if not files:
        return None
    stamps = tuple((str(path), path.stat().st_size, path.stat().st_mtime_ns) for path in files)
    with _weights_lock:
        if stamps in _weights_memo:
            return _weights_memo[stamps]
    parts = []
    for path in files:
        hasher = blake3(max_threads=blake3.AUTO)
        hasher.update_mmap(path)
        parts.append(f"{path.relative_to(root).as_posix()}:{hasher.hexdigest()}")
    digest = fingerprint(parts)
    with _weights_lock:
        _weights_memo[stamps] = digest
    return digest
