"""`RedisTier`: blobs in Redis or Valkey, shared by every host, behind a circuit breaker.

Every operation has a socket timeout (0.25 s by default) and no client-side retries; a failure
opens a `CircuitBreaker`, and while it is open operations return at once without touching the
network (``get`` answers a miss). So a dead or slow server costs at most one timeout per
``retry_interval``; the first call after the interval probes it, and a successful probe puts the
tier back in use. Failures are raised to `TierChain`, which counts them and never lets them
reach a request. Keys are ``key_prefix + key``; values are stored raw (``SET``, with ``EX`` when
``ttl_seconds`` is set) and never decoded here.

With ``cluster=True`` the client is a `redis.cluster.RedisCluster`, created at the first call the
breaker allows (its constructor connects, so a cluster that is down at start-up costs a counted
failure, not an exception out of ``__init__``). After a connection error redis-py re-reads the
slot map from each known node, so in cluster mode a failure costs up to (1 + nodes) timeouts per
``retry_interval`` rather than one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from visioncache.errors import ConfigurationError
from visioncache.tiers.base import TierUnavailable
from visioncache.tiers.breaker import CircuitBreaker

__all__ = ["RedisTier"]

_T = TypeVar("_T")
# ConnectionError and TimeoutError are both RedisError; RedisClusterException (cluster unreachable,
# slot not covered) is not.
_FAILURES = (redis.RedisError, RedisClusterException, OSError)
_SCAN_BATCH = 1000


class RedisTier:
    """A tier on one Redis/Valkey server (``cluster=False``) or a Redis Cluster (``cluster=True``)."""

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "visioncache:",
        ttl_seconds: int | None = None,
        socket_timeout: float = 0.25,
        cluster: bool = False,
        retry_interval: float = 5.0,
        name: str = "redis",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ConfigurationError(f"RedisTier ttl_seconds must be > 0, got {ttl_seconds}")
        if socket_timeout <= 0:
            raise ConfigurationError(f"RedisTier socket_timeout must be > 0, got {socket_timeout}")
        self.name = name
        self.key_prefix = key_prefix
        self.ttl_seconds = ttl_seconds
        self.breaker = CircuitBreaker(retry_interval, clock=clock)
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_timeout,
            # Retrying inside the client would multiply the time a dead server costs.
            "retry": Retry(NoBackoff(), 0),
        }
        self._url = url
        self._options = options
        self._client_lock = threading.Lock()
        self._created: Any = None
        if cluster:
            parse_url(url)  # type: ignore[no-untyped-call]  # a bad URL fails here, not at first use
        else:
            # Creating a client does not connect, so a server that is down now does not fail here.
            self._created = redis.Redis.from_url(url, **options)
        self._failures = 0

    @property
    def _client(self) -> Any:
        """The client; a cluster client is created (which connects) at the first use."""
        if self._created is None:
            with self._client_lock:
                if self._created is None:
                    self._created = redis.cluster.RedisCluster.from_url(self._url, **self._options)
        return self._created

    def _call(self, operation: Callable[[], _T], skipped: _T) -> _T:
        """Run ``operation`` if the breaker allows, else return ``skipped`` without a network call."""
        if not self.breaker.allow():
            return skipped
        try:
            result = operation()
        except _FAILURES:
            self._failures += 1
            self.breaker.record_failure()
            raise
        self.breaker.record_success()
        return result

    def get(self, key: str) -> bytes | None:
        blob: bytes | None = self._call(lambda: self._client.get(self.key_prefix + key), None)
        return blob

    def put(self, key: str, blob: bytes) -> None:
        def write() -> bool:
            self._client.set(self.key_prefix + key, blob, ex=self.ttl_seconds)
            return True

        if not self._call(write, False):  # the breaker is open: nothing was written
            raise TierUnavailable(f"{self.name}: write skipped while its circuit breaker is open")

    def delete(self, key: str) -> None:
        self._call(lambda: self._client.delete(self.key_prefix + key), None)

    def contains(self, key: str) -> bool:
        return bool(self._call(lambda: self._client.exists(self.key_prefix + key), 0))

    def keys(self) -> Iterator[str]:
        """Every key under ``key_prefix``, prefix removed (SCAN: it does not block the server)."""
        pattern = _escape_glob(self.key_prefix) + "*"
        for raw_key in self._client.scan_iter(match=pattern, count=_SCAN_BATCH):
            yield raw_key.decode("utf-8", "surrogateescape")[len(self.key_prefix) :]

    def stored_bytes(self, keys: list[str]) -> int:
        """Memory the server uses for ``keys`` (MEMORY USAGE does not refresh their LRU clocks)."""
        pipeline = self._client.pipeline(transaction=False)
        for key in keys:
            pipeline.memory_usage(self.key_prefix + key, samples=0)
        return sum(usage or 0 for usage in pipeline.execute())

    def stats(self) -> dict[str, int | float]:
        return {
            "failures": self._failures,
            "skipped": self.breaker.skipped,
            "breaker_opens": self.breaker.opens,
            "breaker_open": int(self.breaker.is_open),
        }

    def close(self) -> None:
        if self._created is not None:
            self._created.close()

    def __repr__(self) -> str:
        return f"RedisTier(prefix={self.key_prefix!r}, breaker_open={self.breaker.is_open})"


def _escape_glob(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)
