"""Resolve a batch of keys against a store: hits served, misses deduplicated and computed once.

This is the continuous-batching path of DESIGN.md: every key is looked up; the missing ones that no
other thread is computing are claimed and sent, deduplicated and in first-seen order, to ONE call
of ``compute``; keys another thread is computing are waited for (single-flight); results come back
in input order, a repeated key getting the same value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from visioncache.errors import EncoderOutputError
from visioncache.store import Claim, Store
from visioncache.tiers.chain import TierChain

__all__ = ["Validator", "resolve"]

# validator(index of the item's first occurrence, cached value) -> keep it?
Validator = Callable[[int, Any], bool]


def resolve(
    store: Store,
    keys: Sequence[str],
    items: Sequence[Any],
    compute: Callable[[list[Any]], Sequence[Any]],
    *,
    validate: Validator | None = None,
    what: str = "encode_fn",
    lower: TierChain | None = None,
) -> list[Any]:
    """Values for ``keys`` (one per key, in order); ``compute(items of the misses)`` runs at most once.

    If ``compute`` raises, or returns a wrong number of values, the error reaches this caller and
    every thread waiting for those keys, nothing is stored for them, and a later call retries.
    A cached value that ``validate`` rejects is dropped, counted, and computed again. With
    ``lower`` tiers, an owned key is first looked up there (a hit is promoted into ``store``), and
    computed values are written down to them.
    """
    first_index: dict[str, int] = {}
    occurrences: dict[str, int] = {}
    for index, key in enumerate(keys):
        first_index.setdefault(key, index)
        occurrences[key] = occurrences.get(key, 0) + 1

    values: dict[str, Any] = {}
    owned: list[str] = []
    waiting: dict[str, Future[Any]] = {}
    hits = misses = waits = invalid = 0
    time_saved = 0.0
    try:
        for key, index in first_index.items():
            claim = store.claim(key)
            while claim.hit and validate is not None and not validate(index, claim.value):
                store.discard(key, claim.value)
                invalid += 1
                claim = store.claim(key)
            count = occurrences[key]
            if claim.owner:
                owned.append(key)  # from here on, an exception must abandon this claim
                loaded = lower.load_entry(key) if lower is not None else None
                if loaded is not None and (validate is None or validate(index, loaded[0])):
                    owned.pop()
                    store.fulfil(key, loaded[0], loaded[1])
                    claim = Claim(value=loaded[0], cost=loaded[1])
            if claim.hit:
                values[key] = claim.value
                hits += count
                time_saved += claim.cost * count
                continue
            misses += count
            if not claim.owner:
                assert claim.future is not None
                waiting[key] = claim.future
                waits += 1
    except BaseException as error:
        for key in owned:  # never leave waiters on a claim that nobody will fulfil
            store.abandon(key, error)
        raise
    store.record(hits=hits, misses=misses, singleflight_waits=waits,
                 validation_failures=invalid, time_saved=time_saved)  # fmt: skip

    if owned:
        owned_items = [items[first_index[key]] for key in owned]
        cost = _compute_owned(store, owned, owned_items, compute, what, values)
        if lower is not None:
            for key in owned:
                lower.save_entry(key, values[key], cost)
    for key, future in waiting.items():
        values[key] = future.result()  # re-raises the owner's exception
    return [values[key] for key in keys]


def _compute_owned(
    store: Store,
    owned: list[str],
    owned_items: list[Any],
    compute: Callable[[list[Any]], Sequence[Any]],
    what: str,
    values: dict[str, Any],
) -> float:
    """Compute the owned keys in one call, store and publish them; the seconds per item."""
    started = time.perf_counter()
    try:
        results = list(compute(owned_items))
        if len(results) != len(owned):
            raise EncoderOutputError(
                f"{what} returned {len(results)} values for {len(owned)} images; "
                "it must return exactly one value per image, in order"
            )
    except BaseException as error:
        for key in owned:
            store.abandon(key, error)
        raise
    cost = (time.perf_counter() - started) / len(owned)
    for key, value in zip(owned, results, strict=True):
        store.fulfil(key, value, cost)
        values[key] = value
    store.record(computed=len(owned))
    return cost
