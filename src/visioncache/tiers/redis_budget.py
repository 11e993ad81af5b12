"""`RedisBudget`: a byte budget for a Redis tier's values, least recently used evicted first.

Redis bounds a server's memory (``maxmemory``) and an entry's life (``EX``), not a prefix's bytes:
a tier that shares a server with other data, or the KV tier of `visioncache serve-mlx` beside the
embeddings, needs a bound of its own. Each operation is one Lua script, atomic on the server, so
every process and host sharing the prefix keeps one budget, with no lock and no race:

- a write stores the value, records its size and a use number (``INCR`` of a counter: servers'
  clocks play no part), then deletes the least recently used values until the sum fits;
- a read returns the values and renews the use number of those found (``ZADD XX``);
- a delete removes the value and its record.

The index lives beside the data, under ``"visioncache-budget:" + key_prefix`` (so a ``SCAN`` of the
tier's prefix never sees it): a sorted set of keys by use, a hash of sizes and the running total.
A value is counted by its length (Redis's per-key overhead, some 50-100 bytes, is not). A value
larger than the whole budget is not stored (and an older value under its key is deleted). What
expires (``EX``) or is evicted by the server's ``maxmemory`` stays counted until the budget evicts
its record, so the bound holds, conservatively. One server only: a script may touch only keys of
one cluster slot, so a Redis Cluster cannot take a budget (`RedisTier` refuses the pair).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["INDEX_PREFIX", "RedisBudget"]

INDEX_PREFIX = "visioncache-budget:"

# KEYS: uses (zset), sizes (hash), total, counter, the value's key. ARGV: value, budget, ttl (0: none).
_PUT = """
local size = string.len(ARGV[1])
local budget = tonumber(ARGV[2])
local old = tonumber(redis.call('HGET', KEYS[2], KEYS[5]) or '0')
if size > budget then
  redis.call('DEL', KEYS[5])
  redis.call('ZREM', KEYS[1], KEYS[5])
  redis.call('HDEL', KEYS[2], KEYS[5])
  redis.call('DECRBY', KEYS[3], old)
  return 0
end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[5], ARGV[1], 'EX', ARGV[3])
else
  redis.call('SET', KEYS[5], ARGV[1])
end
redis.call('HSET', KEYS[2], KEYS[5], size)
redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[4]), KEYS[5])
local total = redis.call('INCRBY', KEYS[3], size - old)
while total > budget do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if not oldest then break end
  local gone = tonumber(redis.call('HGET', KEYS[2], oldest) or '0')
  redis.call('DEL', oldest)
  redis.call('ZREM', KEYS[1], oldest)
  redis.call('HDEL', KEYS[2], oldest)
  total = redis.call('DECRBY', KEYS[3], gone)
end
return 1
"""

# KEYS: uses, counter, then the values' keys. Returns the values (nil where missing or not a string).
_GET = """
local values = redis.call('MGET', unpack(KEYS, 3))
for index = 3, #KEYS do
  if values[index - 2] then
    redis.call('ZADD', KEYS[1], 'XX', redis.call('INCR', KEYS[2]), KEYS[index])
  end
end
return values
"""

# KEYS: uses, sizes, total, the value's key.
_DELETE = """
local old = tonumber(redis.call('HGET', KEYS[2], KEYS[4]) or '0')
redis.call('DEL', KEYS[4])
redis.call('ZREM', KEYS[1], KEYS[4])
redis.call('HDEL', KEYS[2], KEYS[4])
if old > 0 then redis.call('DECRBY', KEYS[3], old) end
return old
"""


class RedisBudget:
    """The budgeted reads, writes and deletes of one Redis tier's prefix (names are full keys)."""

    def __init__(self, client: Any, key_prefix: str, max_bytes: int) -> None:
        index = INDEX_PREFIX + key_prefix
        self.max_bytes = max_bytes
        self._client = client
        self._uses, self._sizes = index + "uses", index + "sizes"
        self._total, self._counter = index + "total", index + "counter"
        self._put = client.register_script(_PUT)  # EVALSHA, and EVAL once if the server lost it
        self._get = client.register_script(_GET)
        self._delete = client.register_script(_DELETE)

    def put(self, name: str, blob: bytes, ttl_seconds: int | None) -> bool:
        """Store ``blob`` and evict past the budget; False if it alone exceeds the budget."""
        keys = [self._uses, self._sizes, self._total, self._counter, name]
        return bool(self._put(keys=keys, args=[blob, self.max_bytes, ttl_seconds or 0]))

    def get_many(self, names: Sequence[str]) -> list[bytes | None]:
        values: list[bytes | None] = self._get(keys=[self._uses, self._counter, *names])
        return values

    def delete(self, name: str) -> None:
        self._delete(keys=[self._uses, self._sizes, self._total, name])

    def total(self) -> int:
        """The bytes counted against the budget now (one network call)."""
        return int(self._client.get(self._total) or 0)
