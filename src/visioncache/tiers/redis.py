"""`RedisTier`: blobs in Redis or Valkey, shared by every host.

Every operation has a socket timeout (`defaults.REDIS_TIMEOUT`, 0.25 s) and no client-side retries; a failure
is raised to `TierChain`, whose circuit breaker then skips the tier for its retry interval, so a
dead or stalled server costs at most one timeout per interval. Batched reads are one ``MGET`` (a
standalone server) or one pipeline per node (a cluster: ``mget_nonatomic``). Keys are
``key_prefix + key``; values are stored raw (``SET``, with ``EX`` when ``ttl_seconds`` is set) and
never decoded here. A key of another type under our name (``WRONGTYPE``) is never an outage:
``MGET`` answers nil for it (a miss, and the next write's ``SET`` replaces it), and a single
``get`` raises `CorruptEntryError` for that key only.

With ``max_bytes`` the values under the prefix are kept within that many bytes, least recently
used evicted first, by every process and host alike (`RedisBudget`: one atomic script per
operation; one server, not a cluster).

With ``cluster=True`` the client is a `redis.cluster.RedisCluster`, created at the first call (its
constructor connects, so a cluster that is down at start-up costs a counted failure, not an
exception out of ``__init__``). After a connection error redis-py re-reads the slot map from each
known node, so in cluster mode a failure costs up to (1 + nodes) timeouts per interval, not one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from typing_extensions import override

from visioncache import forking
from visioncache.errors import ConfigurationError, CorruptEntryError
from visioncache.extras import requires
from visioncache.tiers import defaults
from visioncache.tiers import setting_kinds as kinds
from visioncache.tiers.base import BaseTier
from visioncache.tiers.redis_budget import RedisBudget
from visioncache.tiers.stats import TierSizes

with requires("redis", "the Redis tier (visioncache.tiers.redis)"):
    import redis
    import redis.cluster
    from redis.backoff import NoBackoff
    from redis.connection import parse_url
    from redis.retry import Retry

__all__ = ["RedisTier"]

_SCAN_BATCH = 1000


class RedisTier(BaseTier):
    """A tier on one Redis/Valkey server (``cluster=False``) or a Redis Cluster (``cluster=True``)."""

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = defaults.REDIS_PREFIX,
        ttl_seconds: int | None = None,
        socket_timeout: float = defaults.REDIS_TIMEOUT,
        cluster: bool = False,
        max_bytes: int | None = None,
        name: str = "redis",
    ) -> None:
        if max_bytes is not None:
            max_bytes = kinds.size(max_bytes, "RedisTier max_bytes", False)
            if cluster:
                raise ConfigurationError(
                    "RedisTier max_bytes: a byte budget needs one server (a Redis Cluster spreads "
                    "the keys a budget must evict atomically over its nodes); bound a cluster with "
                    "its maxmemory and ttl_seconds"
                )
        if ttl_seconds is not None and kinds.ttl(ttl_seconds, "RedisTier ttl_seconds", False) is None:
            raise ConfigurationError("RedisTier ttl_seconds: expected > 0 (None: never expire), got 0")
        kinds.seconds(socket_timeout, "RedisTier socket_timeout", False)
        try:
            parse_url(url)  # type: ignore[no-untyped-call]  # a bad URL fails here, not at first use
        except (ValueError, TypeError) as error:
            raise ConfigurationError(f"RedisTier: malformed URL {url!r}: {error}") from None
        self.name = name
        self.network = True  # shared by hosts: unsigned blobs can be planted by any writer
        self.key_prefix = key_prefix
        self.ttl_seconds = ttl_seconds
        self.cluster = cluster
        self.max_bytes = max_bytes
        self._url = url
        self._options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_timeout,
            # Retrying inside the client would multiply the time a dead server costs.
            "retry": Retry(NoBackoff(), 0),
        }
        self._client_lock = forking.lock()  # held while a client is made (a cluster's connects)
        self._created: Any = None
        self._budgeted: RedisBudget | None = None

    @property
    def _client(self) -> Any:
        """The client, created at first use (creating a cluster client connects)."""
        if self._created is None:
            with self._client_lock:
                if self._created is None:
                    factory = redis.cluster.RedisCluster if self.cluster else redis.Redis
                    self._created = factory.from_url(self._url, **self._options)
        return self._created

    @property
    def _budget(self) -> RedisBudget | None:
        """The byte budget's scripts (None: no ``max_bytes``)."""
        if self.max_bytes is not None and self._budgeted is None:
            self._budgeted = RedisBudget(self._client, self.key_prefix, self.max_bytes)
        return self._budgeted

    @override
    def get(self, key: str) -> bytes | None:
        if self._budget is not None:
            return self._budget.get_many([self.key_prefix + key])[0]  # a wrong type reads as nil
        try:
            blob: bytes | None = self._client.get(self.key_prefix + key)
        except redis.ResponseError as error:  # e.g. WRONGTYPE: this key, not the server
            raise CorruptEntryError(f"redis key {key!r}: {error}") from error
        return blob

    @override
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        names = [self.key_prefix + key for key in keys]
        if not names:
            return []
        if self._budget is not None:
            return self._budget.get_many(names)
        # MGET answers nil for a key of another type, so one bad key cannot fail the batch.
        blobs: list[bytes | None] = (
            self._client.mget_nonatomic(names) if self.cluster else self._client.mget(names)
        )
        return blobs

    @override
    def put(self, key: str, blob: bytes) -> None:
        if self._budget is not None:
            self._budget.put(self.key_prefix + key, blob, self.ttl_seconds)
            return
        self._client.set(self.key_prefix + key, blob, ex=self.ttl_seconds)

    @override
    def delete(self, key: str) -> None:
        if self._budget is not None:
            self._budget.delete(self.key_prefix + key)
            return
        self._client.delete(self.key_prefix + key)

    @override
    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        pipeline = self._client.pipeline(transaction=False)  # one round trip (per node)
        for key in keys:
            pipeline.exists(self.key_prefix + key)
        return [bool(found) for found in pipeline.execute()]

    @override
    def keys(self) -> Iterator[str]:
        """Every key under ``key_prefix``, prefix removed (SCAN: it does not block the server)."""
        pattern = _escape_glob(self.key_prefix) + "*"
        for raw_key in self._client.scan_iter(match=pattern, count=_SCAN_BATCH):
            yield raw_key.decode("utf-8", "surrogateescape")[len(self.key_prefix) :]

    @override
    def stored_bytes(self, keys: Sequence[str]) -> int:
        """Memory the server uses for ``keys`` (MEMORY USAGE does not refresh their LRU clocks)."""
        pipeline = self._client.pipeline(transaction=False)
        for key in keys:
            pipeline.memory_usage(self.key_prefix + key, samples=0)
        return sum(usage or 0 for usage in pipeline.execute())

    @override
    def sizes(self) -> TierSizes:
        return TierSizes()  # the server knows its sizes; asking it would be a network call

    def budget_bytes(self) -> int | None:
        """Bytes counted against ``max_bytes`` now (one network call; None: no budget)."""
        return self._budget.total() if self._budget is not None else None

    @override
    def close(self) -> None:
        if self._created is not None:
            self._created.close()

    def __repr__(self) -> str:
        return f"RedisTier(prefix={self.key_prefix!r}, cluster={self.cluster})"


def _escape_glob(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)
