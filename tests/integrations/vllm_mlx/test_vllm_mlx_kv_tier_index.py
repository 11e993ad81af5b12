"""`KVTiers` alone, on an in-memory tier (no server): what a lookup finds by its key's blocks, and
what it never finds (another tenant's, a damaged blob, a key diverging inside its first block);
prefixes a longer key extends are deleted; a tenant's forget drops its prefixes only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from tests.support.memory_tier import MemoryTier
from visioncache.integrations.vllm_mlx.kv_blobs import BLOCK
from visioncache.integrations.vllm_mlx.kv_tiers import KVTiers, kv_tier_settings
from visioncache.tiers import TierChain, TierSettings

NAMESPACE = "test-namespace"


def layers(length: int, seed: int = 0) -> list[Any]:
    """Two layers of mlx-lm ``KVCache`` holding ``length`` positions of random keys and values."""
    from mlx_lm.models.cache import KVCache

    rng = np.random.default_rng(seed)
    cache = []
    for _ in range(2):
        layer = KVCache()
        layer.update_and_fetch(
            mx.array(rng.standard_normal((1, 2, length, 8)).astype(np.float32)),
            mx.array(rng.standard_normal((1, 2, length, 8)).astype(np.float32)),
        )
        cache.append(layer)
    return cache


def key_of(length: int, start: int = 1000) -> list[int]:
    ids = list(range(start, start + length))
    ids[3:7] = [-5, -6, -7, -8]  # image ids are negative
    return ids


class Store:
    """The engine cache's ``store``: what it was given."""

    def __init__(self) -> None:
        self.given: list[tuple[list[int], list[Any]]] = []

    def __call__(self, key: list[int], cache: list[Any]) -> bool:
        self.given.append((key, cache))
        return True


@pytest.fixture
def tier() -> MemoryTier:
    return MemoryTier(None)


@pytest.fixture
def kv(tier: MemoryTier) -> KVTiers:
    return KVTiers(TierChain([tier], max_pending_write_bytes=0), NAMESPACE, 2**30)


def test_a_longer_prompt_finds_the_entry_its_key_extends_and_gets_its_exact_layers(kv: KVTiers) -> None:
    stored_key, cache = key_of(3 * BLOCK + 5), layers(3 * BLOCK + 5)
    assert kv.save(stored_key, cache, None)
    store = Store()
    prompt = [*stored_key, 7, 8, 9]
    assert kv.restore(prompt, 0, store, None) == len(stored_key)
    [(key, restored)] = store.given
    assert key == stored_key
    for mine, theirs in zip(cache, restored, strict=True):
        assert theirs.offset == mine.offset
        assert mx.array_equal(theirs.keys, mine.state[0]) and mx.array_equal(theirs.values, mine.state[1])
        assert theirs.keys.dtype == mine.keys.dtype
    # A prompt diverging inside the entry shares what precedes the divergence (the engine trims).
    diverging = [*stored_key[: 2 * BLOCK + 3], 1, 2, 3]
    assert kv.restore(diverging, 0, Store(), None) == 2 * BLOCK + 3
    # What the engine holds already is not looked up again.
    assert kv.restore(prompt, len(stored_key), Store(), None) == 0


def test_nothing_is_found_for_another_tenant_a_short_share_or_a_damaged_blob(
    kv: KVTiers, tier: MemoryTier
) -> None:
    stored_key = key_of(2 * BLOCK)
    assert kv.save(stored_key, layers(2 * BLOCK), "tenant a")
    store = Store()
    assert kv.restore(stored_key, 0, store, "tenant b") == 0
    assert kv.restore([*stored_key[: BLOCK - 1], 0, *stored_key[BLOCK:]], 0, store, "tenant a") == 0
    assert store.given == []
    for name in [name for name in list(tier.keys()) if name.startswith("kv/")]:
        blob = bytearray(tier.get(name) or b"")
        blob[len(blob) // 2] ^= 1
        tier.put(name, bytes(blob))
    assert kv.restore(stored_key, 0, store, "tenant a") == 0 and store.given == []
    stats = kv.stats()
    assert stats["kv_tier_corrupt"] == 1 and stats["kv_tier_restores"] == 0
    assert not [name for name in list(tier.keys()) if name.startswith("kv/")]  # deleted


def test_an_entry_a_longer_key_extends_is_deleted_and_forget_drops_one_tenants_prefixes(
    kv: KVTiers, tier: MemoryTier
) -> None:
    first = key_of(BLOCK + 10)
    assert kv.save(first, layers(BLOCK + 10), "a")
    assert kv.save([*first, 1, 2, 3], layers(BLOCK + 13, seed=1), "a")
    assert kv.save(key_of(BLOCK + 10, start=5000), layers(BLOCK + 10), "b")
    entries = [name for name in list(tier.keys()) if name.startswith("kv/")]
    assert len(entries) == 2 and kv.stats()["kv_tier_superseded"] == 1
    assert kv.forget("a") == 1
    left = [name for name in list(tier.keys()) if name.startswith(("kv/", "kvp/"))]
    assert len(left) == 2  # b's prefix and its one block pointer
    assert kv.restore(key_of(BLOCK + 10, start=5000), 0, Store(), "b") == BLOCK + 10


def test_the_kv_chain_has_its_own_disk_folder_budget_and_redis_prefix() -> None:
    tiers = TierSettings(disk_dir="/var/cache/vc", disk_max_bytes="20GiB", redis_url="redis://h:6379/0")
    settings = kv_tier_settings(tiers, 2**20)
    assert settings is not None
    assert (settings.disk_dir, settings.disk_max_bytes) == ("/var/cache/vc/kv", 2**20)
    assert settings.redis_prefix == tiers.redis_prefix + "kv:" and settings.redis_url == tiers.redis_url
    assert settings.redis_max_bytes == 2**20  # Redis holds the KV within the same budget
    assert kv_tier_settings(tiers, 0) is None and kv_tier_settings(TierSettings(), 2**20) is None


def test_kv_in_a_redis_cluster_is_bounded_by_the_cluster_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tiers = TierSettings(redis_url="redis://h:6379/0", redis_cluster=True)
    settings = kv_tier_settings(tiers, 2**20)
    assert settings is not None and settings.redis_max_bytes is None  # a budget needs one server
    assert "maxmemory" in caplog.text


def test_the_kv_budget_comes_from_the_flag_else_the_environment_else_1gib(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from visioncache import ConfigurationError
    from visioncache.integrations.vllm_mlx import VisionCacheSettings
    from visioncache.integrations.vllm_mlx.launcher import build_parser

    def budget(*flags: str) -> str:
        args = build_parser().parse_args(["--vision-cache-model-id", "m", *flags])
        return VisionCacheSettings.from_args(args, model_path=None).max_kv_bytes

    monkeypatch.delenv("VISIONCACHE_MAX_KV_BYTES", raising=False)
    assert budget() == "1GiB"
    monkeypatch.setenv("VISIONCACHE_MAX_KV_BYTES", "3MiB")
    assert budget() == "3MiB" and budget("--vision-cache-max-kv-bytes", "0") == "0"
    assert VisionCacheSettings.from_options(model_id="m", tiers_from_env=True).max_kv_bytes == "3MiB"
    with pytest.raises(ConfigurationError, match="max_kv_bytes"):
        budget("--vision-cache-max-kv-bytes", "lots")
