"""`Level`: one cache level — its memory `Store`, the shared tiers below it, and the policy between.

This module is the one owner of the memory → tier policy (docs/design.md, principle 4):

- **read-through**: a key missing from memory is looked up in the tiers — all of a call's missing
  keys in ONE batched read (`TierChain.load_entries`) — and a tier hit is stored in memory;
  promotion into upper tiers is the chain's, through its background writer;
- **write-down**: a value stored in memory is queued for the tiers (a snapshot, in the background);
- **single-flight** (`resolve`, the continuous-batching path): every key is claimed; the claims this
  call owns are first read from the tiers in one batch, and only the rest are computed, in ONE call
  of ``compute`` with the items deduplicated in first-seen order. Keys another thread is computing
  are waited for. Every owned claim is fulfilled or abandoned, whatever fails;
- **placement**: a value read from a tier is moved to the level's device (``device=`` if given,
  else the device of the last value computed here, else left on the CPU), so where a value lives
  does not depend on where it came from. Its bytes are counted once, against the store's device
  budget while it lives on an accelerator (spilled to the host past it), else the host budget;
- **evaluated before shared**: a value computed or loaded here is evaluated on this thread
  (lazy mlx arrays) before memory, a waiting thread or the tier writer gets it, since MLX runs
  pending work only on the thread that holds its stream;
- **one walk per value**: what is computed or loaded is prepared once (`trees.prepare`: views
  copied, mlx evaluated, placed, sized, its device found), and the store and the tier writer
  use that size instead of walking the value again;
- **counting**: hits, misses, waits and validation failures are counted once per lookup, from the
  caller's point of view (a tier hit is a hit).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from visioncache.errors import EncoderOutputError, InvalidArgumentError, describe_input
from visioncache.store.store import PutResult, Store, StoreStats
from visioncache.tiers.chain import TierChain
from visioncache.trees import Prepared, materialise, prepare

__all__ = ["Level", "Validator", "as_results"]

# validator(index of the item's first occurrence, cached value) -> keep it?
Validator = Callable[[int, Any], bool]


class Level:
    """One level: ``store`` in memory, ``tiers`` (shared, optional) below it."""

    def __init__(self, name: str, store: Store, tiers: TierChain | None = None, *, device: Any = None):
        self.name = name
        self.store = store
        self.tiers = tiers
        self.device = device
        self._produced_on: Any = None  # device of the last value computed here

    @property
    def enabled(self) -> bool:
        return self.store.enabled

    # ---- lookups without computing -------------------------------------------------------------
    def get(self, key: str) -> Any | None:
        """The value of ``key`` from memory or, failing that, the tiers; None if nowhere."""
        entry = self.store.lookup(key)
        if entry is not None:  # the hit path: no list, no tier
            self.store.record_hit(entry.cost)
            return entry.value
        (loaded,) = self._read_through([key])
        if loaded is None:
            self.store.record(misses=1)
            return None
        self.store.record(hits=1, time_saved=loaded[1])
        return loaded[0]

    def get_many(self, keys: Sequence[str]) -> list[Any | None]:
        """The value of each key (None where missing everywhere); one tier read for all misses."""
        if len(keys) == 1:
            return [self.get(keys[0])]
        values: list[Any | None] = []
        missing: list[int] = []
        time_saved = 0.0
        for index, key in enumerate(keys):
            entry = self.store.lookup(key)
            values.append(None if entry is None else entry.value)
            if entry is None:
                missing.append(index)
            else:
                time_saved += entry.cost
        found = 0
        loaded_entries = self._read_through([keys[index] for index in missing])
        for index, loaded in zip(missing, loaded_entries, strict=True):
            if loaded is not None:
                values[index] = loaded[0]
                time_saved += loaded[1]
                found += 1
        hits = len(keys) - len(missing) + found
        self.store.record(hits=hits, misses=len(keys) - hits, time_saved=time_saved)
        return values

    def _read_through(self, keys: list[str]) -> list[tuple[Any, float] | None]:
        """`_read_tiers` for keys missing from memory, storing each tier hit in memory."""
        loaded = self._read_tiers(keys)
        for key, entry in zip(keys, loaded, strict=True):
            if entry is not None:
                self.store.put(
                    key, entry[0].value, cost=entry[1], nbytes=entry[0].nbytes, device=entry[0].device
                )
        return [None if entry is None else (entry[0].value, entry[1]) for entry in loaded]

    def _read_tiers(self, keys: list[str]) -> list[tuple[Prepared, float] | None]:
        """Tier hits, prepared (placed on the level's device) for memory."""
        if not keys or self.tiers is None or not self.store.enabled:
            return [None] * len(keys)
        device = self.device if self.device is not None else self._produced_on
        return [
            None if entry is None else (_prepared(entry[0], device), entry[1])
            for entry in self.tiers.load_entries(keys)
        ]

    # ---- writes --------------------------------------------------------------------------------
    def put(self, key: str, value: Any, cost: float = 0.0) -> PutResult:
        """Store ``value`` in memory and queue it for the tiers (unless the level is disabled)."""
        if not self.store.enabled:
            return PutResult.DISABLED
        prepared = _prepared(value)
        result = self.store.put(
            key, prepared.value, cost=cost, nbytes=prepared.nbytes, device=prepared.device
        )
        if result is not PutResult.DISABLED and self.tiers is not None:
            self.tiers.save_entry(key, prepared.value, cost, nbytes=prepared.nbytes)
        return result

    # ---- the continuous-batching path ----------------------------------------------------------
    def resolve(
        self,
        keys: Sequence[str],
        items: Sequence[Any],
        compute: Callable[[list[Any]], Iterable[Any]],
        *,
        validate: Validator | None = None,
        what: str = "encode_fn",
    ) -> list[Any]:
        """Values for ``keys`` (one per key, in order); ``compute(items of the misses)`` runs at most once.

        If ``compute`` raises or returns a wrong number of values, the error reaches this caller and
        every thread waiting for those keys, nothing is stored for them, and a later call retries.
        A cached value that ``validate`` rejects is dropped, counted, and computed again.
        """
        store = self.store
        if validate is None:  # the hit path: every key in memory, no dict, no claim
            found, time_saved = [], 0.0
            for key in keys:
                entry = store.find(key)
                if entry is None:
                    break
                found.append(entry.value)
                time_saved += entry.cost
            else:
                store.record(hits=len(keys), time_saved=time_saved)
                return found
        first_index: dict[str, int] = {}
        occurrences: dict[str, int] = {}
        for index, key in enumerate(keys):
            first_index.setdefault(key, index)
            occurrences[key] = occurrences.get(key, 0) + 1

        values: dict[str, Any] = {}
        owned: list[str] = []
        waiting: dict[str, Any] = {}
        hits = waits = invalid = 0
        time_saved = 0.0
        try:
            for key, index in first_index.items():
                claim = store.claim(key)
                while claim.hit and validate is not None and not validate(index, claim.value):
                    store.discard(key, claim.value)
                    invalid += 1
                    claim = store.claim(key)
                if claim.owner:
                    owned.append(key)  # from here on, an exception must abandon this claim
                elif claim.hit:
                    values[key] = claim.value
                    hits += occurrences[key]
                    time_saved += claim.cost * occurrences[key]
                else:
                    waiting[key] = claim.future
                    waits += 1
            computed = []
            for key, loaded in zip(owned, self._read_tiers(owned), strict=True):
                if loaded is not None and (validate is None or validate(first_index[key], loaded[0].value)):
                    values[key] = store.fulfil(
                        key, loaded[0].value, loaded[1], nbytes=loaded[0].nbytes, device=loaded[0].device
                    )
                    hits += occurrences[key]
                    time_saved += loaded[1] * occurrences[key]
                else:
                    invalid += loaded is not None
                    computed.append(key)
        except BaseException as error:
            for key in owned:  # never leave waiters on a claim nobody will fulfil (no-op if done)
                store.abandon(key, error)
            raise
        store.record(
            hits=hits,
            misses=len(keys) - hits,
            singleflight_waits=waits,
            validation_failures=invalid,
            time_saved=time_saved,
        )
        if computed:
            self._compute([items[first_index[key]] for key in computed], computed, compute, what, values)
        for key, future in waiting.items():
            values[key] = future.result()  # re-raises the owner's exception
        return [values[key] for key in keys]

    def _compute(
        self,
        items: list[Any],
        owned: list[str],
        compute: Callable[[list[Any]], Iterable[Any]],
        what: str,
        values: dict[str, Any],
    ) -> None:
        """Compute the owned keys in one call, store, publish and write them down."""
        started = time.perf_counter()
        fulfilled = 0
        sizes: list[int] = []
        try:
            results = as_results(compute(items), len(owned), what)
            cost = (time.perf_counter() - started) / len(owned)
            for key, value in zip(owned, results, strict=True):
                if not self.store.enabled:  # nothing kept: evaluated for the waiters only
                    values[key] = self.store.fulfil(key, materialise(value), cost, nbytes=0)
                else:
                    prepared = _prepared(value, what=what)
                    if not fulfilled:
                        self._produced_on = prepared.device
                    values[key] = self.store.fulfil(
                        key, prepared.value, cost, nbytes=prepared.nbytes, device=prepared.device
                    )
                    sizes.append(prepared.nbytes)
                fulfilled += 1
        except BaseException as error:
            for key in owned[fulfilled:]:
                self.store.abandon(key, error)
            raise
        self.store.record(computed=len(owned))
        if self.tiers is not None and self.store.enabled:
            for key, nbytes in zip(owned, sizes, strict=True):
                self.tiers.save_entry(key, values[key], cost, nbytes=nbytes)

    # ---- pins and inspection -------------------------------------------------------------------
    def pin(self, key: str) -> None:
        self.store.pin(key)

    def unpin(self, key: str) -> None:
        self.store.unpin(key)

    def stats(self) -> StoreStats:
        return self.store.stats()

    def discard(self, key: str) -> int:
        """Remove ``key`` from memory and from every tier; how many copies were removed."""
        removed = int(self.store.discard(key))
        return removed + (self.tiers.delete(key) if self.tiers is not None else 0)

    def clear(self) -> None:
        self.store.clear()

    def __repr__(self) -> str:
        return f"<Level {self.name} {self.store!r} tiers={self.tiers is not None}>"


def _prepared(value: Any, device: Any | None = None, *, what: str | None = None) -> Prepared:
    """`trees.prepare`, with the store's errors: a value that cannot be sized is bad input
    (`InvalidArgumentError`), or, returned by an encoder (``what``), a bad output."""
    try:
        return prepare(value, device)
    except Exception as error:  # e.g. a torch sparse tensor, whose nbytes raises
        message = f"cannot size a value to cache ({describe_input(value)}): {error!r}"
        if what is not None:
            raise EncoderOutputError(f"{what} returned a value visioncache {message}") from error
        raise InvalidArgumentError(message) from error


def as_results(results: Any, count: int, what: str) -> list[Any]:
    """``results`` as a list of exactly ``count`` values, or `EncoderOutputError`.

    A mapping or a set is refused although it iterates: a dict iterates over its keys (a per-image
    dict returned for the whole batch would cache key strings as values), a set in no fixed order.
    """
    if (
        results is None
        or isinstance(results, str | bytes | bytearray | Mapping | AbstractSet)
        or not isinstance(results, Iterable)
    ):
        raise EncoderOutputError(
            f"{what} returned {describe_input(results)}; it must return one value per image, in order"
        )
    values = list(results)
    if len(values) != count:
        raise EncoderOutputError(
            f"{what} returned {len(values)} values for {count} images; "
            "it must return exactly one value per image, in order"
        )
    return values
