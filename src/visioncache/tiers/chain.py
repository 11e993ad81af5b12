"""`TierChain`: read-through / write-through over shared tiers, where a failing tier never fails a call.

The cache's in-memory `Store` sits above the chain; the chain holds the tiers below it, in order
(typically disk, then Redis). `load` tries them in turn, and a hit in a lower tier is written back
into the earlier tiers that missed; `save` serialises once and writes to every tier. Any exception
a tier raises is caught and counted (``errors``); a blob that fails `serialization.loads` (truncated,
altered, forged, wrong version) is counted (``corrupt``), deleted and treated as a miss. So a call
returns a correct tree or None, never an error and never someone else's entry.

Keys are the cache's ``"<namespace tag>/<level>/<hex digest>"``; the namespace and salt are in the
tag, so two namespaces sharing a server never see each other's entries. `register_namespace`
stores ``__namespaces__/<tag>`` -> the readable namespace name, for `visioncache stats`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from visioncache.errors import ConfigurationError, CorruptEntryError, UnserializableValueError
from visioncache.serialization import dumps, loads
from visioncache.tiers.base import Tier, TierUnavailable
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.writer import EXIT_FLUSH_SECONDS, BackgroundWriter
from visioncache.values import parse_byte_size

__all__ = ["NAMESPACE_PREFIX", "TierChain", "namespace_name"]

logger = logging.getLogger(__name__)

NAMESPACE_PREFIX = "__namespaces__/"
_COUNTERS = ("hits", "misses", "errors", "corrupt", "writes", "promotions")


def namespace_name(record: bytes) -> str | None:
    """The namespace name in a ``__namespaces__/<tag>`` record, or None if it is unreadable."""
    try:
        name = json.loads(record).get("name")
    except (ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


DEFAULT_WRITE_QUEUE = 64


class TierChain:
    """Tiers tried in order; ``secret`` (bytes) makes every blob HMAC-signed and checked.

    `save_entry` (what the cache calls) writes in the background through a queue of
    ``write_queue`` entries (`tiers.writer`); ``write_queue=0`` writes on the caller's thread.
    `save` always writes on the caller's thread.
    """

    def __init__(
        self, tiers: Sequence[Tier], *, secret: bytes | None = None, write_queue: int = DEFAULT_WRITE_QUEUE
    ) -> None:
        names = [tier.name for tier in tiers]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"tier names must be unique, got {names}")
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise ConfigurationError("the HMAC secret must be non-empty bytes")
        self.tiers = tuple(tiers)
        self._secret = secret
        self._lock = threading.Lock()
        self._counts = {tier.name: dict.fromkeys(_COUNTERS, 0) for tier in self.tiers}
        self._unserializable = 0
        self._registered: set[str] = set()
        if write_queue < 0:
            raise ConfigurationError(f"write_queue must be >= 0, got {write_queue}")
        self._writer = BackgroundWriter(write_queue) if write_queue else None

    def _count(self, tier: Tier, counter: str) -> None:
        with self._lock:  # `+=` on a dict item is not atomic across threads
            self._counts[tier.name][counter] += 1

    def load(self, key: str) -> Any | None:
        """The tree stored under ``key`` in the first tier that has an intact copy, or None."""
        missed: list[Tier] = []
        for tier in self.tiers:
            try:
                blob = tier.get(key)
                if blob is None:
                    self._count(tier, "misses")
                    missed.append(tier)
                    continue
                tree = loads(blob, secret=self._secret, context=key)
            except CorruptEntryError as error:
                logger.warning("tier %s: deleting corrupt entry %s: %s", tier.name, key, error)
                self._count(tier, "corrupt")
                self._call(tier, "delete", key)
                missed.append(tier)
                continue
            except Exception as error:  # a tier must never fail a request
                self._record_error(tier, "get", error)
                continue
            self._count(tier, "hits")
            for upper in missed:
                if self._call(upper, "put", key, blob):
                    self._count(upper, "promotions")
            return tree
        return None

    def save(self, key: str, tree: object) -> bool:
        """Serialise ``tree`` once and write it to every tier; True if at least one stored it.

        A tree the serialisation cannot hold is counted (``unserializable``) and not stored: the
        caller still has its value, and the request goes on uncached.
        """
        try:
            blob = dumps(tree, secret=self._secret, context=key)
        except UnserializableValueError as error:
            logger.warning("not storing %s in shared tiers: %s", key, error)
            with self._lock:
                self._unserializable += 1
            return False
        stored = False
        for tier in self.tiers:
            if self._call(tier, "put", key, blob):
                self._count(tier, "writes")
                stored = True
        return stored

    def load_entry(self, key: str) -> tuple[Any, float] | None:
        """A cache entry saved by `save_entry`: its value and the seconds it cost to compute."""
        envelope = self.load(key)
        if not isinstance(envelope, dict) or set(envelope) != {"value", "cost"}:
            return None
        cost = envelope["cost"]
        return envelope["value"], float(cost) if isinstance(cost, int | float) else 0.0

    def save_entry(self, key: str, value: object, cost: float) -> bool:
        """Store a cache entry with its cost (so a hit after promotion still counts time saved):
        queued for the background writer, or written now without one. False if not stored."""
        if self._writer is not None:
            return self._writer.submit(partial(self._save_entry_now, key, value, cost))
        return self._save_entry_now(key, value, cost)

    def _save_entry_now(self, key: str, value: object, cost: float) -> bool:
        return self.save(key, {"value": value, "cost": float(cost)})

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued background writes; False if ``timeout`` seconds passed first."""
        return self._writer.flush(timeout) if self._writer is not None else True

    def register_namespace(self, tag: str, name: str) -> None:
        """Record once per process that ``tag`` stands for namespace ``name`` (for `stats`);
        in the background when the chain has a writer, so a slow tier cannot delay start-up."""
        if tag in self._registered:
            return
        self._registered.add(tag)
        if self._writer is not None:
            self._writer.submit(partial(self._register_now, tag, name))
        else:
            self._register_now(tag, name)

    def _register_now(self, tag: str, name: str) -> None:
        record = json.dumps({"tag": tag, "name": name}).encode()
        for tier in self.tiers:
            self._call(tier, "put", NAMESPACE_PREFIX + tag, record)

    def _call(self, tier: Tier, method: str, key: str, *args: bytes) -> bool:
        """Call ``tier.<method>(key, *args)``; on an exception count it and return False."""
        try:
            getattr(tier, method)(key, *args)
        except TierUnavailable:  # skipped without trying; the tier counts its skips
            return False
        except Exception as error:
            self._record_error(tier, method, error)
            return False
        return True

    def _record_error(self, tier: Tier, method: str, error: Exception) -> None:
        # The Redis tier's breaker limits this to one failure per interval for a dead server.
        logger.warning("tier %s: %s failed: %r", tier.name, method, error)
        self._count(tier, "errors")

    def stats(self) -> dict[str, dict[str, int | float]]:
        """Per tier: the chain's counters plus the tier's own (a failing tier reports only ours)."""
        result: dict[str, dict[str, int | float]] = {}
        for tier in self.tiers:
            try:
                own = tier.stats()
            except Exception as error:
                logger.warning("tier %s: stats failed: %r", tier.name, error)
                own = {}
            with self._lock:
                result[tier.name] = {**own, **self._counts[tier.name]}
        writer = self._writer
        with self._lock:
            result["chain"] = {
                "unserializable": self._unserializable,
                "writes_pending": writer.pending if writer is not None else 0,
                "writes_dropped": writer.dropped if writer is not None else 0,
            }
        return result

    def close(self) -> None:
        """Flush queued writes (up to the exit flush time), then close every tier."""
        if self._writer is not None and not self._writer.close(EXIT_FLUSH_SECONDS):
            logger.warning("closing tiers with %d writes still queued", self._writer.pending)
        for tier in self.tiers:
            try:
                tier.close()
            except Exception as error:
                logger.warning("tier %s: close failed: %r", tier.name, error)

    @classmethod
    def from_spec(cls, spec: TierChain | Sequence[Tier] | str | None) -> TierChain | None:
        """A chain from what `VisionEmbeddingCache(tiers=...)` accepts: a chain, a list of tiers,
        None (memory only), or ``"env"`` (`from_env`)."""
        if spec is None or isinstance(spec, TierChain):
            return spec
        if spec == "env":
            return cls.from_env()
        if isinstance(spec, str):
            raise ConfigurationError(f"tiers must be a TierChain, a list of tiers, None or 'env': {spec!r}")
        return cls(list(spec)) if spec else None

    @classmethod
    def from_env(
        cls, prefix: str = "VISIONCACHE_", environ: Mapping[str, str] | None = None
    ) -> TierChain | None:
        """A chain configured by environment variables; None when no tier is configured.

        ``{prefix}DISK_DIR``: directory of a disk tier (under /dev/shm: shared memory).
        ``{prefix}DISK_MAX_BYTES``: its budget, e.g. ``20GiB`` (default: the directory's stored
        limit, or diskcache's 1 GB for a new one).
        ``{prefix}REDIS_URL``: ``redis://`` / ``rediss://`` URL of a Redis/Valkey tier.
        ``{prefix}REDIS_PREFIX``: its key prefix (default ``visioncache:``).
        ``{prefix}REDIS_TTL``: seconds before its entries expire (default or 0: never).
        ``{prefix}REDIS_CLUSTER``: ``1`` for a Redis Cluster client.
        ``{prefix}REDIS_TIMEOUT``: per-operation timeout in seconds (default 0.25).
        ``{prefix}REDIS_RETRY_INTERVAL``: seconds a failed Redis tier is skipped (default 5).
        ``{prefix}HMAC_SECRET``: sign and check every blob with HMAC-SHA256 under this secret.
        ``{prefix}WRITE_QUEUE``: background writes queued at most (default 64; 0: write on the
        caller's thread).
        """
        env = os.environ if environ is None else environ

        def setting(name: str) -> str | None:
            value = env.get(prefix + name, "").strip()
            return value or None

        def number(name: str, default: float) -> float:
            text = setting(name)
            if text is None:
                return default
            try:
                return float(text)
            except ValueError:
                raise ConfigurationError(f"{prefix}{name}: expected a number, got {text!r}") from None

        tiers: list[Tier] = []
        disk_dir = setting("DISK_DIR")
        if disk_dir is not None:
            max_bytes = parse_byte_size(setting("DISK_MAX_BYTES"), name=prefix + "DISK_MAX_BYTES")
            tiers.append(DiskTier(disk_dir, max_bytes))
        redis_url = setting("REDIS_URL")
        if redis_url is not None:
            from visioncache.tiers.redis import RedisTier  # redis-py is an optional extra

            ttl = int(number("REDIS_TTL", 0))
            tiers.append(
                RedisTier(
                    redis_url,
                    key_prefix=env.get(prefix + "REDIS_PREFIX", "visioncache:"),
                    ttl_seconds=ttl or None,
                    socket_timeout=number("REDIS_TIMEOUT", 0.25),
                    cluster=(setting("REDIS_CLUSTER") or "0").lower() in ("1", "true", "yes"),
                    retry_interval=number("REDIS_RETRY_INTERVAL", 5.0),
                )
            )
        if not tiers:
            return None
        secret = setting("HMAC_SECRET")
        write_queue = int(number("WRITE_QUEUE", DEFAULT_WRITE_QUEUE))
        return cls(tiers, secret=None if secret is None else secret.encode(), write_queue=write_queue)
