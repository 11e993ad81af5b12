"""Image-aware KV keys and the prefix-cache wrapper: each way two prompts could wrongly share KV."""

from __future__ import annotations

from typing import Any

import pytest

from visioncache import PlaceholderMismatchError
from visioncache.integrations.vllm_mlx.kv_keys import PrefixKey, image_run_ids, prefix_key, tenant_key
from visioncache.integrations.vllm_mlx.prefix_cache import ImageAwarePrefixCache, select_request
from visioncache.integrations.vllm_mlx.stats import EngineStats

PAD = 5  # the image placeholder token id
TOKENS = [1, 9, 9, 3, PAD, PAD, PAD, PAD, 4, 9, 3, PAD, PAD, 4, 12]  # two images: 4 and 2 tokens
A, B = b"a" * 32, b"b" * 32  # image digests


def key_of(images: list[tuple[bytes, int]], tokens: list[int] = TOKENS, **identity: Any) -> tuple[int, ...]:
    options = {"namespace": "ns", "salt": None, **identity}
    return prefix_key(tokens, PAD, images, **options).key


def test_placeholders_get_negative_ids_and_text_keeps_its_token_ids() -> None:
    key = key_of([(A, 4), (B, 2)])
    assert len(key) == len(TOKENS)
    for token, value in zip(TOKENS, key, strict=True):
        assert (value < 0) if token == PAD else (value == token)
    assert len(set(key[4:8]) | set(key[11:13])) == 6  # every placeholder id differs
    assert key_of([(A, 4), (B, 2)]) == key  # deterministic
    assert all(-(2**31) <= value < 0 for value in image_run_ids("ns", None, A, 0, 1000))


@pytest.mark.parametrize(
    ("what", "other"),
    [
        ("other images", {"images": [(b"c" * 32, 4), (b"d" * 32, 2)]}),
        ("the images swapped", {"images": [(B, 4), (A, 2)]}),
        ("the same images one token later", {"tokens": [1, *TOKENS]}),
        ("another namespace (model or processor)", {"namespace": "ns2"}),
        ("another tenant salt", {"salt": "tenant-b"}),
    ],
)
def test_a_different_image_position_namespace_or_tenant_never_shares_image_ids(
    what: str, other: dict[str, Any]
) -> None:
    images = other.pop("images", [(A, 4), (B, 2)])
    tokens = other.pop("tokens", TOKENS)
    ours = {value for value, token in zip(key_of([(A, 4), (B, 2)]), TOKENS, strict=True) if token == PAD}
    theirs = {
        value for value, token in zip(key_of(images, tokens, **other), tokens, strict=True) if token == PAD
    }
    assert len(ours) == len(theirs) == 6 and not ours & theirs, what


def test_a_salt_keys_text_only_prompts_apart_too() -> None:
    text = [1, 9, 9, 3, 4, 12]
    assert tenant_key(text, None) == tuple(text)
    salted = tenant_key(text, "tenant-a")
    assert salted[1:] == tuple(text[1:]) and salted[0] < 0
    assert salted != tenant_key(text, "tenant-b") and salted == tenant_key(text, "tenant-a")
    assert key_of([(A, 4), (B, 2)], salt="tenant-a")[0] != key_of([(A, 4), (B, 2)], salt="tenant-b")[0]


def test_placeholder_count_must_match_the_images() -> None:
    with pytest.raises(PlaceholderMismatchError, match="6 image placeholder tokens but its images need 5"):
        key_of([(A, 4), (B, 1)])


class FakePrefixCache:
    """Records the keys it is asked for; holds one stored key."""

    def __init__(self) -> None:
        self.stored: tuple[int, ...] = ()
        self.asked: list[list[int]] = []

    def fetch(self, key: list[int]) -> tuple[Any, list[int]]:
        self.asked.append(key)
        if self.stored and tuple(key[: len(self.stored)]) == self.stored:
            self._last_matched_key = self.stored  # as MemoryAwarePrefixCache names the entry
            return "kv", key[len(self.stored) :]
        return None, key

    def store(self, key: list[int], cache: Any, **kwargs: Any) -> bool:
        self.stored = tuple(key)
        return True

    def get_stats(self) -> dict[str, int]:
        return {"entries": int(bool(self.stored))}


def test_wrapper_translates_the_selected_requests_ids_and_reports_reuse() -> None:
    inner, stats = FakePrefixCache(), EngineStats()
    cache = ImageAwarePrefixCache(inner, stats)
    first = prefix_key(TOKENS[:9], PAD, [(A, 4)], namespace="ns", salt=None)
    second = prefix_key(TOKENS, PAD, [(A, 4), (B, 2)], namespace="ns", salt=None)
    select_request(first)
    assert cache.store(TOKENS[:9], "kv") and inner.stored == first.key
    select_request(second)
    kv, remaining = cache.fetch(TOKENS)
    assert kv == "kv" and remaining == TOKENS[9:]  # token ids again, for vllm-mlx
    assert inner.asked[-1] == list(second.key)
    assert (stats.kv_prefix_hits, stats.kv_tokens_reused) == (1, 9)
    assert cache.get_stats() == {"entries": 1}  # anything else is the wrapped cache's


def test_wrapper_answers_a_miss_for_ids_that_are_not_the_selected_requests() -> None:
    """Same token ids with another image (placeholders look alike) must never reach the store."""
    inner, stats = FakePrefixCache(), EngineStats()
    cache = ImageAwarePrefixCache(inner, stats)
    select_request(PrefixKey((1, 2, 3), (1, -7, 3)))
    assert cache.fetch([1, 2, 4]) == (None, [1, 2, 4])
    assert not cache.store([1, 2, 4], "kv")
    assert inner.asked == [] and inner.stored == ()


def test_wrapper_without_selection_keys_text_by_token_ids_or_by_tenant() -> None:
    inner = FakePrefixCache()
    select_request(None)
    ImageAwarePrefixCache(inner, EngineStats()).fetch([1, 2, 3])
    ImageAwarePrefixCache(inner, EngineStats(), salt="tenant-a").fetch([1, 2, 3])
    assert inner.asked[0] == [1, 2, 3] and inner.asked[1] == list(tenant_key([1, 2, 3], "tenant-a"))


def test_wrapper_turns_a_hit_the_family_cannot_prefill_exactly_into_a_miss() -> None:
    """`PrefixKey.reusable` (the family's `reusable_prefix`) sees how many tokens a hit reuses and
    how long the stored entry is; a hit it refuses is answered as a miss (the engine prefills the
    prompt whole, as stock vllm-mlx prefills every image prompt)."""
    asked: list[tuple[int, int | None]] = []
    for allowed in (False, True):
        inner, stats = FakePrefixCache(), EngineStats()
        cache = ImageAwarePrefixCache(inner, stats)
        first = prefix_key(TOKENS[:9], PAD, [(A, 4)], namespace="ns", salt=None)
        select_request(first)
        cache.store(TOKENS[:9], "kv")

        def reusable(reused: int, stored: int | None, allowed: bool = allowed) -> bool:
            asked.append((reused, stored))
            return allowed

        second = prefix_key(TOKENS, PAD, [(A, 4), (B, 2)], namespace="ns", salt=None, reusable=reusable)
        select_request(second)
        kv, remaining = cache.fetch(TOKENS)
        assert (kv, remaining) == (("kv", TOKENS[9:]) if allowed else (None, TOKENS))
        assert (stats.kv_prefix_refused, stats.kv_prefix_hits) == ((0, 1) if allowed else (1, 0))
    assert asked == [(9, 9), (9, 9)]


def test_the_stored_length_is_read_from_vllm_mlx_memory_aware_prefix_cache() -> None:
    """The wrapper reads the matched entry's length from MemoryAwarePrefixCache (vllm-mlx 0.6.0
    keeps its key as ``_last_matched_key``); if a release stops keeping it, the length reads None
    and a family that needs it (Gemma 4) refuses the hit rather than guess."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache
    from vllm_mlx.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig

    inner = MemoryAwarePrefixCache(model=None, config=MemoryCacheConfig(max_memory_mb=64))
    stats = EngineStats()
    cache = ImageAwarePrefixCache(inner, stats)
    layer = KVCache()
    layer.update_and_fetch(mx.zeros((1, 1, 130, 4)), mx.zeros((1, 1, 130, 4)))
    select_request(None)
    tokens = list(range(1, 141))
    assert cache.store(tokens[:130], [layer])
    seen: list[tuple[int, int | None]] = []
    select_request(PrefixKey(tuple(tokens), tuple(tokens), lambda *hit: seen.append(hit) or True))
    kv, remaining = cache.fetch(tokens)
    assert kv is not None and remaining == tokens[130:] and seen == [(130, 130)]


def test_covered_reads_the_longest_shared_prefix_without_touching_the_stored_entries() -> None:
    """The probe that decides which images are not encoded (`ImageAwarePrefixCache.covered`):
    the longest prefix any stored key shares with the prompt's, and no LRU move or counter."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache
    from vllm_mlx.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig

    inner = MemoryAwarePrefixCache(model=None, config=MemoryCacheConfig(max_memory_mb=64))
    cache = ImageAwarePrefixCache(inner, EngineStats())
    stored = prefix_key([*TOKENS, *range(20, 140)], PAD, [(A, 4), (B, 2)], namespace="ns", salt=None)
    layer = KVCache()
    layer.update_and_fetch(mx.zeros((1, 1, 135, 4)), mx.zeros((1, 1, 135, 4)))
    select_request(stored)
    assert cache.store(list(stored.token_ids), [layer])
    hits = inner.get_stats()["hits"]
    longer = prefix_key([*TOKENS, *range(20, 150)], PAD, [(A, 4), (B, 2)], namespace="ns", salt=None)
    other_image = prefix_key(
        [*TOKENS, *range(20, 150)], PAD, [(A, 4), (b"c" * 32, 2)], namespace="ns", salt=None
    )
    assert cache.covered(longer) == len(stored.key)
    assert cache.covered(other_image) == 11  # up to the other image's first placeholder
    assert ImageAwarePrefixCache(FakePrefixCache(), EngineStats()).covered(longer) == 0  # no index: none
    assert inner.get_stats()["hits"] == hits


def test_covered_images_are_those_whose_tokens_all_precede_the_last_reused_token() -> None:
    from visioncache.integrations.vllm_mlx.covered import covered_images

    # images of 4 tokens (positions 4-7) and 2 tokens (positions 11-12)
    assert covered_images(TOKENS, PAD, [4, 2], 0) == []
    assert covered_images(TOKENS, PAD, [4, 2], 8) == []  # an exact hit re-runs token 7
    assert covered_images(TOKENS, PAD, [4, 2], 9) == [0]
    assert covered_images(TOKENS, PAD, [4, 2], 12) == [0]  # image 2 only partly reused
    assert covered_images(TOKENS, PAD, [4, 2], 14) == [0, 1]


def test_a_prefill_reaching_a_stood_in_image_encodes_it_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact by construction: whatever the engine's fetch reuses in the end (a refused hit, an
    entry evicted after the probe), no stand-in's zero rows reach the model."""
    from visioncache.integrations.vllm_mlx import step

    encoded: list[list[str]] = []

    def encode_now(state: Any, images: list[str]) -> list[dict[str, Any]]:
        encoded.append(images)
        return [{"image_features": f"features of {image}"} for image in images]

    class Family:
        def hook_inputs(self, model: Any, values: list[dict[str, Any]]) -> dict[str, Any]:
            return {"features": [value["image_features"] for value in values]}

        def feed(self, model: Any, input_ids: Any, hook: dict[str, Any]) -> Any:
            return dict(hook)

    class Ids:
        ndim = 2

    monkeypatch.setattr(step, "encode_now", encode_now)
    state = step.EngineState.__new__(step.EngineState)
    state.stats = EngineStats()
    values = [{"image_features": "zeros"}, {"image_features": "zeros"}, {"image_features": "real c"}]
    prepared = step.PreparedRequest(
        model=None,
        family=Family(),  # type: ignore[arg-type]
        prefix_key=None,
        hook={"pixel_values": None, **Family().hook_inputs(None, values)},
        stood_in=step.StoodIn(state, {0: ("a", 8), 1: ("b", 13)}, values),
    )
    assert prepared.feed(Ids(), 13)["features"] == ["zeros", "zeros", "real c"]  # a tail after both
    assert prepared.feed(Ids(), 9)["features"] == ["zeros", "features of b", "real c"]
    assert prepared.feed(Ids(), 0)["features"] == ["features of a", "features of b", "real c"]
    assert encoded == [["b"], ["a"]] and state.stats.kv_covered_images_encoded_late == 2
