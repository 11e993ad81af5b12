"""The tier interface: a byte store addressed by str keys, below the in-memory store.

A tier stores opaque blobs (what `visioncache.serialization.dumps` produced); it never interprets
them, so every tier can be checked by one contract test suite. A tier may raise on a failure
(I/O, network); `visioncache.tiers.chain.TierChain` catches, counts and skips it, so a failing
tier never fails a request. ``stats`` must be cheap and make no network call: it runs at every
metrics scrape.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Tier", "TierUnavailable"]


class TierUnavailable(Exception):
    """A tier skipped a write without trying it (e.g. its circuit breaker is open).

    Not a failure to count: the tier counts its own skips. The chain only learns that the blob
    was not stored.
    """


@runtime_checkable
class Tier(Protocol):
    """One level of shared storage (memory, disk, Redis): blobs by key."""

    name: str

    def get(self, key: str) -> bytes | None:
        """The blob stored under ``key``, or None."""
        ...

    def put(self, key: str, blob: bytes) -> None:
        """Store ``blob`` under ``key``, replacing any older one; may evict other keys. Raises
        `TierUnavailable` when it skips the write without trying."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        ...

    def contains(self, key: str) -> bool:
        """Whether ``key`` is stored (without counting a hit or a miss)."""
        ...

    def stats(self) -> dict[str, int | float]:
        """Counters and sizes this tier knows locally (no network call)."""
        ...

    def close(self) -> None:
        """Release files, connections and threads; the tier is unusable afterwards."""
        ...
