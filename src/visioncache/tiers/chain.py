"""`TierChain`: the shared tiers below memory, where a failing tier never fails a call.

The chain holds the tiers in order (typically disk, then Redis) and is the only code that talks to
them. Guarantees:

- **bounded cost**: every tier sits behind its own `CircuitBreaker`. A tier that raises (down,
  locked, stalled past its timeout) is counted and then skipped, without a call, for
  ``retry_interval`` seconds: at most one timeout per interval, then zero;
- **batched reads**: `load_many` asks each tier once for all the keys still missing (one ``MGET``
  or pipeline per Redis node, one transaction on disk). A hit in a lower tier is promoted into the
  upper tiers that missed, through the background writer;
- **never a wrong value**: a blob that fails `serialization.loads` (truncated, altered, misplaced)
  is counted as ``corrupt``, deleted and missed; one signed under a secret this chain does not
  accept is counted as ``unverified`` and missed, but not deleted (another fleet may read it);
- **snapshots, not references**: `save_entry` reserves room in the writer's byte budget, then
  walks the value once on the caller's thread (`serialization.flatten`: its skeleton, and its
  arrays copied to fresh host memory; lazy mlx arrays are evaluated there, since MLX runs pending
  work only on the thread holding its stream); the writer packs and writes the bytes in the
  background. Mutating the value afterwards never reaches a tier. Queued
  bytes never exceed ``max_pending_write_bytes`` (beyond it, writes are dropped and counted);
  ``max_pending_write_bytes=0`` writes on the caller's thread;
- **keys that reveal nothing**: with HMAC ``secrets``, the digest part of each tier key is keyed
  with a key derived from the secret (the cache's salt keys it already), so listing a server's
  keys does not tell whether a known image was processed. ``secrets`` lists accepted secrets:
  writes sign (and key) with the first, reads try each, so fleets can rotate without evicting
  each other. Without a secret, anyone who can write to a shared tier can plant values: a
  `UnsignedTierWarning` says so once per process for network tiers;
- **no side effects at construction**: files, connections and the writer thread start at the
  first operation. `close` flushes queued writes, then closes the tiers.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

from blake3 import blake3

from visioncache import forking
from visioncache.errors import ConfigurationError, CorruptEntryError, UnverifiableEntryError
from visioncache.tiers import defaults
from visioncache.tiers import setting_kinds as kinds
from visioncache.tiers.base import Tier
from visioncache.tiers.breaker import CircuitBreaker
from visioncache.tiers.guard import GuardedTier
from visioncache.tiers.namespaces import NAMESPACE_PREFIX, namespace_record
from visioncache.tiers.serialization import Flat, flatten, loads, pack
from visioncache.tiers.stats import ChainStats
from visioncache.tiers.writer import EXIT_FLUSH_SECONDS, BackgroundWriter, Job
from visioncache.trees import tree_nbytes

__all__ = [
    "DEFAULT_MAX_PENDING_WRITE_BYTES",
    "TierChain",
    "UnsignedTierWarning",
    "WritesAtClose",
    "tier_keys_under",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_PENDING_WRITE_BYTES = defaults.MAX_PENDING_WRITE_BYTES
_warned_unsigned = False


class UnsignedTierWarning(UserWarning):
    """A network tier without an HMAC secret: anyone who can write to it can plant values."""


class TierChain:
    """Tiers tried in order, each behind a breaker (see the module docstring for the guarantees).

    ``secret_setting`` is how the caller's configuration takes a secret, named by the
    `UnsignedTierWarning` (`TierSettings` passes its source's spelling).
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        secrets: Sequence[bytes] = (),
        retry_interval: float = defaults.RETRY_INTERVAL,
        max_pending_write_bytes: int = defaults.MAX_PENDING_WRITE_BYTES,
        clock: Callable[[], float] = time.monotonic,
        secret_setting: str = "TierChain(secrets=[...])",
    ) -> None:
        names = [tier.name for tier in tiers]
        if not tiers or len(set(names)) != len(names):
            raise ConfigurationError(f"a TierChain needs tiers with unique names, got {names}")
        if isinstance(secrets, (bytes, bytearray, str)):
            raise ConfigurationError("TierChain secrets: expected a list of secrets, e.g. secrets=[b'...']")
        accepted = list(secrets)
        if not all(isinstance(item, bytes) and item for item in accepted):
            raise ConfigurationError("HMAC secrets must be non-empty bytes")
        kinds.size_or_zero(max_pending_write_bytes, "max_pending_write_bytes", False)
        self.tiers = tuple(tiers)
        self._guarded = [GuardedTier(tier, CircuitBreaker(retry_interval, clock=clock)) for tier in tiers]
        self._secrets: list[bytes | None] = list(accepted) or [None]
        self._key_secrets = [_key_secret(item) for item in accepted]
        self._lock = forking.lock()
        self._unserializable = 0
        self._namespaces: dict[str, str] = {}  # tag -> name, written with the first save
        self._registered: set[str] = set()
        self._writer = BackgroundWriter(max_pending_write_bytes) if max_pending_write_bytes else None
        if not accepted and any(tier.network for tier in tiers):
            _warn_unsigned([tier.name for tier in tiers if tier.network], secret_setting)

    # ---- keys ----------------------------------------------------------------------------------
    def tier_keys(self, key: str) -> list[str]:
        """The keys ``key`` is stored under, one per accepted secret (writes use the first)."""
        return _rekeyed(key, self._key_secrets)

    # ---- reads ---------------------------------------------------------------------------------
    def load_many(self, keys: Sequence[str]) -> list[Any | None]:
        """The tree stored under each key in the first tier with an intact copy (None: nowhere)."""
        results: list[Any | None] = [None] * len(keys)
        variants = [self.tier_keys(key) for key in keys]
        width = len(self._secrets)
        pending = list(range(len(keys)))
        missed: dict[int, list[GuardedTier]] = {index: [] for index in pending}
        for tier in self._guarded:
            if not pending:
                break
            names = [name for index in pending for name in variants[index]]
            try:
                ok, blobs = tier.call(partial(tier.tier.get_many, names))
            except CorruptEntryError:  # a tier should answer per key; treat it as a miss here
                ok = False
            if not ok:
                continue  # skipped or failed: no promotion into it either
            still_missing = []
            for position, index in enumerate(pending):
                found = self._decode(
                    tier, keys[index], variants[index], blobs[position * width : (position + 1) * width]
                )
                if found is None:
                    missed[index].append(tier)
                    still_missing.append(index)
                    continue
                results[index], name, blob = found
                for upper in missed[index]:
                    self._submit(len(blob), self._put_job(upper, name, blob, "promotions"))
            tier.add("hits", len(pending) - len(still_missing))
            tier.add("misses", len(still_missing))
            pending = still_missing
        return results

    def _decode(
        self, tier: GuardedTier, key: str, names: list[str], blobs: Sequence[bytes | None]
    ) -> tuple[Any, str, bytes] | None:
        """(tree, tier key, blob) of the first blob that verifies under its secret, or None."""
        for name, blob, secret in zip(names, blobs, self._secrets, strict=True):
            if blob is None:
                continue
            try:
                return loads(blob, secret=secret, context=key), name, blob
            except UnverifiableEntryError:
                tier.add("unverified")
            except CorruptEntryError as error:
                logger.warning("tier %s: deleting corrupt entry %s: %s", tier.name, name, error)
                tier.add("corrupt")
                self._submit(0, partial(tier.call, partial(tier.tier.delete, name)))
        return None

    def load_entries(self, keys: Sequence[str]) -> list[tuple[Any, float] | None]:
        """Cache entries saved by `save_entry`: (value, seconds it cost to compute), or None."""
        return [_unwrap(envelope) for envelope in self.load_many(keys)]

    def load_entry(self, key: str) -> tuple[Any, float] | None:
        return self.load_entries([key])[0]

    def delete(self, key: str) -> int:
        """Remove ``key``, under every accepted secret, from every tier now (a purge); how many
        stored copies were removed. A tier that fails is counted and skipped, as for reads."""
        names = self.tier_keys(key)
        removed = 0
        for tier in self._guarded:
            try:
                ok, present = tier.call(partial(tier.tier.contains_many, names))
            except CorruptEntryError:  # a key of the wrong type: delete it all the same
                ok, present = True, [True] * len(names)
            for name, found in zip(names, present if ok else [], strict=False):
                if found and tier.call(partial(tier.tier.delete, name))[0]:
                    removed += 1
        return removed

    # ---- writes --------------------------------------------------------------------------------
    def save(self, key: str, tree: object) -> bool:
        """Serialise ``tree`` once and write it to every tier now; True if at least one stored it.

        A tree that cannot be serialised is counted (``unserializable``) and not stored: the
        caller still has its value, and the request goes on uncached.
        """
        try:
            return self._write(key, flatten(tree))
        except Exception as error:  # any failure to serialise must not fail the request
            return self._not_stored(key, error)

    def _write(self, key: str, flat: Flat) -> bool:
        """Pack ``flat`` (bytes only: the tree was walked already) and write it to every tier."""
        try:
            blob = pack(flat, secret=self._secrets[0], context=key)
        except Exception as error:
            return self._not_stored(key, error)
        self._register_namespaces()
        name = self.tier_keys(key)[0]
        stored = [self._put_job(tier, name, blob, "writes")() for tier in self._guarded]
        return any(stored)

    def save_entry(self, key: str, value: object, cost: float, *, nbytes: int | None = None) -> bool:
        """Store a cache entry with its cost: a snapshot queued for the background writer (or
        written now without one). False if it was not stored or queued. ``nbytes``: the value's
        size, if the caller knows it (`visioncache.trees.prepare`), so it is not walked again.

        The caller's thread walks the value once: `serialization.flatten` copies its arrays to
        fresh host memory (the snapshot) and writes its skeleton; the writer only packs bytes."""
        envelope = {"value": value, "cost": float(cost)}
        if self._writer is None:
            return self.save(key, envelope)

        def prepare() -> Job:
            flat = flatten(envelope, snapshot=True)
            return lambda: self._write(key, flat)

        try:
            return self._writer.submit(tree_nbytes(value) if nbytes is None else nbytes, prepare)
        except Exception as error:  # a leaf that cannot be sized or copied
            return self._not_stored(key, error)

    def _not_stored(self, key: str, error: Exception) -> bool:
        """Count a value the tiers cannot hold; the caller still has it, the request goes on."""
        logger.warning("not storing %s in shared tiers: %r", key, error)
        with self._lock:
            self._unserializable += 1
        return False

    def _put_job(self, tier: GuardedTier, name: str, blob: bytes, counter: str) -> Callable[[], bool]:
        def job() -> bool:
            ok, _ = tier.call(partial(tier.tier.put, name, blob))
            if ok:
                tier.add(counter)
            return ok

        return job

    def _submit(self, nbytes: int, job: Callable[[], object]) -> None:
        """Run ``job`` in the background (or now, without a writer); dropped if the queue is full."""
        if self._writer is None:
            job()
        else:
            self._writer.submit(nbytes, lambda: job)

    def register_namespace(self, tag: str, name: str) -> None:
        """Record that ``tag`` stands for namespace ``name`` (for `visioncache stats`); the record
        is written with the first save, not now."""
        with self._lock:
            self._namespaces.setdefault(tag, name)

    def _register_namespaces(self) -> None:
        with self._lock:
            new = {tag: name for tag, name in self._namespaces.items() if tag not in self._registered}
            self._registered.update(new)
        for tag, name in new.items():
            record = namespace_record(tag, name)
            for tier in self._guarded:
                tier.call(partial(tier.tier.put, NAMESPACE_PREFIX + tag, record))

    # ---- lifecycle -----------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued background writes; False if ``timeout`` seconds passed first."""
        return self._writer.flush(timeout) if self._writer is not None else True

    def stats(self) -> ChainStats:
        """Per tier: counts, breaker and sizes (see `GuardedTier.stats`: no wait on a failing tier)."""
        writer = self._writer
        return ChainStats(
            tiers=tuple(tier.stats() for tier in self._guarded),
            unserializable=self._unserializable,
            writes_pending=writer.pending if writer is not None else 0,
            writes_pending_bytes=writer.pending_bytes if writer is not None else 0,
            writes_dropped=writer.dropped if writer is not None else 0,
        )

    def close(self, timeout: float = EXIT_FLUSH_SECONDS) -> WritesAtClose:
        """Flush queued writes for up to ``timeout`` seconds, drop those not started by then
        (counted in ``writes_dropped``), then close every tier. Returns how many were dropped,
        and how many were still running at the deadline (may or may not land)."""
        writer = self._writer
        result = WritesAtClose(0, 0)
        deadline = time.monotonic() + timeout
        # Most of the time flushing; the rest for the write running when the queue is dropped.
        if writer is not None and not writer.close(timeout - min(1.0, timeout / 4)):
            dropped = writer.abandon()
            writer.flush(max(0.0, deadline - time.monotonic()))
            result = WritesAtClose(dropped, writer.pending)
            logger.warning("closing tiers: %d queued writes dropped unwritten, %d still running", *result)
        for tier in self._guarded:
            tier.close()
        return result


def tier_keys_under(key: str, secrets: Sequence[bytes]) -> list[str]:
    """The tier keys of ``key`` under each HMAC secret (``[key]`` without one): the digest part
    keyed with a key derived from the secret, so a tier's key list reveals no image digest."""
    return _rekeyed(key, [_key_secret(secret) for secret in secrets])


def _key_secret(secret: bytes) -> bytes:
    return blake3(b"visioncache/tier-key/v1\0" + secret).digest()


def _rekeyed(key: str, key_secrets: Sequence[bytes]) -> list[str]:
    if not key_secrets:
        return [key]
    prefix, _, digest = key.rpartition("/")
    encoded = digest.encode("utf-8", "surrogatepass")
    return [f"{prefix}/{blake3(encoded, key=secret).hexdigest()}" for secret in key_secrets]


class WritesAtClose(NamedTuple):
    """What `TierChain.close` could not write: dropped unstarted, and running at the deadline."""

    dropped: int
    unfinished: int


def _unwrap(envelope: Any) -> tuple[Any, float] | None:
    if not isinstance(envelope, dict) or set(envelope) != {"value", "cost"}:
        return None
    cost = envelope["cost"]
    return envelope["value"], float(cost) if isinstance(cost, int | float) else 0.0


def _warn_unsigned(names: list[str], secret_setting: str) -> None:
    global _warned_unsigned
    if _warned_unsigned:
        return
    _warned_unsigned = True
    warnings.warn(
        f"shared tier(s) {names} have no HMAC secret: anyone who can write to them can plant values "
        f"that every reader serves; set {secret_setting} (docs/tiers.md)",
        UnsignedTierWarning,
        stacklevel=3,
    )
