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

`Tier` is the interface the chain calls; `BaseTier` is the base to write a new tier on. It defines the
batched and optional methods in terms of four single-key ones (``get``, ``put``, ``delete``,
``keys``), so a new tier implements those four and overrides the others only where its storage does
them better (one round trip, a local size count): tests/tiers/test_base_tier.py proves a four-method
tier passes the contract suite.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

from visioncache.errors import CorruptEntryError
from visioncache.tiers.stats import TierSizes

__all__ = ["BaseTier", "Tier"]


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


class BaseTier(ABC):
    """A base for tiers: four methods to write, the rest defined in terms of them.

    A subclass sets ``name`` (how stats and logs call it) and ``network`` (True when other hosts can
    write to it), and implements `get`, `put`, `delete` and `keys`. The defaults:

    - `get_many` and `contains_many` ask `get` key by key (override them with one round trip or one
      transaction where the storage has it);
    - `sizes` knows nothing (all None: right for a tier that would need a network call to know);
    - `stored_bytes` is the length of each blob (override it where the storage spends more);
    - `close` releases nothing.

    Raise on a failure of the storage (the chain counts it and its breaker skips the tier for a while);
    raise `visioncache.errors.CorruptEntryError` for a problem with one key only.
    """

    name: str = "tier"
    network: bool = False

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The blob stored under ``key``.

        Args:
            key: the entry's key, as the chain formats it.

        Returns:
            The stored bytes, or None if nothing is stored under ``key``.

        Raises:
            visioncache.errors.CorruptEntryError: this key holds something that is not a blob.
        """

    @abstractmethod
    def put(self, key: str, blob: bytes) -> None:
        """Store ``blob`` under ``key``, replacing any older one.

        Args:
            key: the entry's key.
            blob: opaque bytes; the tier never interprets them.

        A tier may evict other keys to stay within its bound, and may decline a blob larger than its
        whole budget (then it counts a rejection in `sizes`).
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` if present; a missing key is not an error.

        Args:
            key: the entry's key.
        """

    @abstractmethod
    def keys(self) -> Iterator[str]:
        """Every key stored (namespace records included), without touching recency.

        Returns:
            An iterator of keys; it may be slow (only ``visioncache stats`` and purges call it).
        """

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The blobs of ``keys``, in order, None where missing (default: `get` for each key).

        Args:
            keys: the entries' keys.

        Returns:
            One answer per key. A key that holds something other than a blob answers ``b""``, which
            the chain treats as a corrupt entry, so one bad key never fails the batch.
        """
        answers: list[bytes | None] = []
        for key in keys:
            try:
                answers.append(self.get(key))
            except CorruptEntryError:
                answers.append(b"")
        return answers

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored, without counting hits or misses (default: `get_many`).

        Args:
            keys: the entries' keys.

        Returns:
            One bool per key, in order.
        """
        return [blob is not None for blob in self.get_many(keys)]

    def sizes(self) -> TierSizes:
        """Entries, bytes and budget as far as the tier knows them without a network call.

        Returns:
            `TierSizes`; the default knows nothing (None everywhere, no rejections).
        """
        return TierSizes()

    def stored_bytes(self, keys: Sequence[str]) -> int:
        """Bytes the tier spends on ``keys`` (default: each blob's length).

        Args:
            keys: the entries' keys.

        Returns:
            The total, in bytes; missing keys count 0.
        """
        return sum(len(blob) for blob in self.get_many(keys) if blob)

    def close(self) -> None:  # noqa: B027  (a tier with nothing to release need not override it)
        """Release files, connections and threads (default: nothing to release)."""
