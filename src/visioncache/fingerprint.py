"""One way to fingerprint a configuration: blake3 over framed parts, for cache namespaces.

Integrations name what shapes a cached value (model config, processor settings, dtype, weights) by
a fingerprint of those parts. Every part is length-framed, so two different lists of parts never
hash the same bytes, and settings are serialised by `stable_json`, so two equal configurations
always give the same fingerprint (no memory addresses, no dict-order dependence).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from blake3 import blake3

from visioncache.identity import frame

__all__ = ["fingerprint", "stable_json"]


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
