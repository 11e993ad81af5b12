"""vllm-mlx's KV prefix cache, consulted with image-aware keys for image requests.

vllm-mlx asks its prefix cache with a request's token ids, right after asking
``is_text_only_prefix_cache_request(request)``. The integration replaces that check (`select_request`):
for a request whose images went through visioncache it selects the request's `PrefixKey` and
answers True; for any other request it selects nothing and gives vllm-mlx's own answer. The
`ImageAwarePrefixCache` wrapper then translates token ids into the selected key (and remaining
keys back into token ids). A lookup whose ids are not the selected request's is never translated:
it is answered as a miss, so a wrong request can never be served another's KV.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from typing import Any

from visioncache.integrations.vllm_mlx.kv_keys import PrefixKey, tenant_key
from visioncache.integrations.vllm_mlx.kv_tiers import KVTiers
from visioncache.integrations.vllm_mlx.stats import EngineStats

__all__ = ["ImageAwarePrefixCache", "select_request"]

_selection = threading.local()  # the scheduler thread's selected PrefixKey (or None)


class _OwnSalt:
    """No tenant selected: a wrapper keys text by its own salt."""


_OWN_SALT = _OwnSalt()


def select_request(prefix_key: PrefixKey | None, salt: str | bytes | _OwnSalt | None = _OWN_SALT) -> None:
    """Make ``prefix_key`` the key of the next lookups and stores on this thread (None: token ids,
    keyed for the request's tenant ``salt``, a str, bytes or None)."""
    _selection.key = prefix_key
    _selection.salt = salt


def _selected() -> PrefixKey | None:
    key: PrefixKey | None = getattr(_selection, "key", None)
    return key


class ImageAwarePrefixCache:
    """Wraps a ``MemoryAwarePrefixCache``; every other attribute is the wrapped cache's.

    With a tenant ``salt``, text-only prompts are keyed by `tenant_key` too, so nothing is shared
    with another tenant's engine over a shared or persisted prefix cache.
    """

    def __init__(
        self, inner: Any, stats: EngineStats, salt: str | bytes | None = None, tiers: KVTiers | None = None
    ) -> None:
        self._inner = inner
        self._stats = stats
        self._salt = salt
        self._tiers = tiers  # image-aware prefixes written behind and restored (`kv_tiers`)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _key(self, tokens: Sequence[int]) -> list[int] | None:
        """The key to use for ``tokens``: their tenant key, the selected request's key, or None
        (ids that are not the selected request's: answer as a miss)."""
        selected = _selected()
        if selected is None:
            return list(tenant_key(tokens, self._tenant()))
        count = len(tokens)
        if count > len(selected.token_ids) or tuple(tokens) != selected.token_ids[:count]:
            return None
        return list(selected.key[:count])

    def _tenant(self) -> str | bytes | None:
        """The selected request's tenant secret (this wrapper's own salt if none was selected)."""
        salt = getattr(_selection, "salt", _OWN_SALT)
        return self._salt if isinstance(salt, _OwnSalt) else salt

    def fetch(self, tokens: list[int]) -> tuple[Any, list[int]]:
        key = self._key(tokens)
        if key is None:
            return None, tokens
        if self._tiers is not None and _selected() is not None:  # what memory lacks, from the tiers
            self._tiers.restore(key, self._shared(key), self._inner.store, self._tenant())
        cache, remaining = self._inner.fetch(key)
        selected = _selected()
        if selected is None:
            return cache, list(tokens[len(tokens) - len(remaining) :])
        reused = len(tokens) - len(remaining) if cache is not None else 0
        if reused and selected.reusable is not None and not selected.reusable(reused, self._stored()):
            self._stats.kv_prefix_refused += 1
            return None, tokens  # prefilled whole, as stock vllm-mlx prefills every image prompt
        if reused:
            self._stats.kv_prefix_hits += 1
            self._stats.kv_tokens_reused += reused
        else:
            self._stats.kv_prefix_misses += 1
        return cache, list(tokens[len(tokens) - len(remaining) :])

    def covered(self, prefix_key: PrefixKey) -> int:
        """How many of ``prefix_key``'s first tokens a stored entry shares, without touching the
        wrapped cache (no LRU move, no counter): its longest common prefix with the stored keys,
        which one of its two neighbours in vllm-mlx's sorted key index has. 0 where the wrapped
        cache keeps no such index. An estimate for `covered` images only: the engine's own
        fetch decides what is reused."""
        return self._shared(prefix_key.key)

    def _shared(self, ids: Sequence[int]) -> int:
        """`covered`'s estimate for a key's ids."""
        keys = getattr(self._inner, "_sorted_keys", None)
        if not isinstance(keys, list) or not keys:
            return 0
        key = tuple(ids)
        index = bisect.bisect_left(keys, key)
        best = 0
        for neighbour in keys[max(index - 1, 0) : index + 1]:
            shared = 0
            for mine, theirs in zip(key, neighbour, strict=False):
                if mine != theirs:
                    break
                shared += 1
            best = max(best, shared)
        return best

    def _stored(self) -> int | None:
        """The length of the stored entry the last fetch matched (MemoryAwarePrefixCache keeps
        its key, vllm-mlx 0.6.0), or None where the wrapped cache does not say."""
        matched = getattr(self._inner, "_last_matched_key", None)
        return len(matched) if isinstance(matched, tuple) else None

    def fetch_exact_auxiliary(self, tokens: list[int]) -> Any:
        return self._call_keyed(self._inner.fetch_exact_auxiliary, tokens)

    def store(self, tokens: list[int], cache: Any, **kwargs: Any) -> Any:
        stored = self._call_keyed(lambda key: self._inner.store(key, cache, **kwargs), tokens) or False
        if stored and self._tiers is not None and _selected() is not None:  # an image-aware key
            key = self._key(tokens)
            if key is not None:
                self._tiers.save(key, cache, self._tenant())
        return stored

    def prepare_store(self, tokens: list[int], cache: Any, auxiliary: dict[str, Any] | None = None) -> Any:
        return self._call_keyed(
            lambda key: self._inner.prepare_store(key, cache, auxiliary=auxiliary), tokens
        )

    def _call_keyed(self, call: Callable[[list[int]], Any], tokens: list[int]) -> Any:
        key = self._key(tokens)
        return None if key is None else call(key)
