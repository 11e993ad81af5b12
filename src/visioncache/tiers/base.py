"""The tier interface: a byte store addressed by str keys, below the in-memory store.

A tier stores opaque blobs (what `visioncache.tiers.serialization.dumps` produced); it never interprets
them, so every tier can be checked by one contract test suite. A tier raises on a failure (I/O,
network, a lock it could not take within its timeout); `visioncache.tiers.chain.TierChain` catches
and counts it, and a circuit breaker then skips the tier for a while, so a failing tier never
fails a request and costs at most one timeout per retry interval. A problem with one key only
(e.g. a Redis key of the wrong type) is raised as `CorruptEntryError`: the chain treats that key
as a corrupt entry, not the tier as down. Constructing a tier opens nothing: files and connections
start at the first operation. ``sizes`` must be cheap and make no network call: it runs at every
metrics scrape. ``network`` says whether other hosts can write to the tier: then, without an HMAC
secret, anyone who can reach it can plant values (`UnsignedTierWarning`). ``keys`` and
``stored_bytes`` serve ``visioncache stats`` and may be slow; no request path calls them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

from visioncache.tiers.stats import TierSizes

__all__ = ["Tier"]


@runtime_checkable
class Tier(Protocol):
    """One level of shared storage (memory, disk, Redis): blobs by key."""

    name: str
    network: bool  # shared with other hosts: unsigned blobs could be planted by any of them

    def get(self, key: str) -> bytes | None:
        """The blob stored under ``key``, or None."""
        ...

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The blobs of ``keys``, in order (None where missing), in one round trip or transaction."""
        ...

    def put(self, key: str, blob: bytes) -> None:
        """Store ``blob`` under ``key``, replacing any older one; may evict other keys."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        ...

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored (without counting hits or misses), in one round trip."""
        ...

    def keys(self) -> Iterator[str]:
        """Every key stored (namespace records included), without touching recency."""
        ...

    def sizes(self) -> TierSizes:
        """Entries, bytes and budget as far as this tier knows them locally (no network call)."""
        ...

    def stored_bytes(self, keys: Sequence[str]) -> int:
        """Bytes the tier spends on ``keys`` (may ask the server; the disk tier answers its volume)."""
        ...

    def close(self) -> None:
        """Release files, connections and threads; the tier is unusable afterwards."""
        ...
