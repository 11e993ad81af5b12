"""``visioncache purge`` and `visioncache.tiers.purge`: entries removed by namespace, tenant or
image, under every secret and salt given, from a real disk tier and a real redis-server; and a
cache's own `discard_images` (memory + tiers). After a purge the next request encodes again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.tiers.conftest import RedisProcess
from visioncache import VisionEmbeddingCache
from visioncache.cli import main
from visioncache.errors import ConfigurationError
from visioncache.tiers import TierSettings
from visioncache.tiers.purge import PurgeSelection

RED, GREEN = b"red image bytes", b"green image bytes"


def _encoder(calls: list[int]) -> Callable[[list[Any]], list[np.ndarray]]:
    def encode(images: list[Any]) -> list[np.ndarray]:
        calls.append(len(images))
        return [np.full((2, 4), len(calls), np.float32) for _ in images]

    return encode


def _cache(tiers: TierSettings, namespace: str = "model-a", salt: str | None = None) -> VisionEmbeddingCache:
    return VisionEmbeddingCache(namespace=namespace, salt=salt, tiers=tiers, max_embedding_bytes="1MiB")


def _fill(tiers: TierSettings) -> None:
    """Model A: RED and GREEN unsalted, RED for tenants one and two; model B: RED unsalted."""
    for namespace, salt, images in (
        ("model-a", None, [RED, GREEN]),
        ("model-a", "tenant-one", [RED]),
        ("model-a", "tenant-two", [RED]),
        ("model-b", None, [RED]),
    ):
        cache = _cache(tiers, namespace, salt)
        cache.encode_images(images, _encoder([]))
        cache.close()


def _encodes(tiers: TierSettings, namespace: str, salt: str | None, image: bytes) -> int:
    """How many images a fresh process's cache encodes for ``image`` (0: found in the tier)."""
    calls: list[int] = []
    cache = _cache(tiers, namespace, salt)
    cache.encode_images([image], _encoder(calls))
    cache.close()
    return sum(calls)


def _purge(where: list[str], *flags: str) -> None:
    assert main(["purge", *where, *flags]) == 0


@pytest.fixture(params=["disk", "redis"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[TierSettings, list[str]]:
    if request.param == "disk":
        directory = tmp_path / "tier"
        return TierSettings(disk_dir=str(directory)), ["--disk", str(directory)]
    server: RedisProcess = request.getfixturevalue("redis_server")
    prefix = request.getfixturevalue("redis_prefix")
    settings = TierSettings(redis_url=server.url, redis_prefix=prefix, secrets=(b"fleet-secret",))
    return settings, ["--redis", server.url, "--prefix", prefix, "--hmac-secret-env", "FLEET_SECRET"]


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_SECRET", "fleet-secret")
    monkeypatch.setenv("TENANT_ONE", "tenant-one")


def test_an_image_purged_for_a_tenant_is_encoded_again_and_nothing_else(
    tier: tuple[TierSettings, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings, where = tier
    _fill(settings)
    image = tmp_path / "red.png"
    image.write_bytes(RED)
    _purge(where, "--image", str(image), "--salt-env", "TENANT_ONE")
    assert "removed 1 entries" in capsys.readouterr().out
    assert _encodes(settings, "model-a", "tenant-one", RED) == 1
    assert _encodes(settings, "model-a", "tenant-two", RED) == 0  # another tenant's copy stays
    assert _encodes(settings, "model-a", None, RED) == 0
    assert _encodes(settings, "model-b", None, RED) == 0


def test_an_image_purged_without_a_tenant_leaves_the_tenants_copies(
    tier: tuple[TierSettings, list[str]],
) -> None:
    settings, where = tier
    _fill(settings)
    _purge(where, "--digest", VisionEmbeddingCache().image_digests([RED])[0].hex())
    assert [_encodes(settings, name, None, RED) for name in ("model-a", "model-b")] == [1, 1]
    assert _encodes(settings, "model-a", "tenant-one", RED) == 0
    assert _encodes(settings, "model-a", None, GREEN) == 0


def test_a_tenant_purged_loses_every_entry_and_only_its_own(tier: tuple[TierSettings, list[str]]) -> None:
    settings, where = tier
    _fill(settings)
    _purge(where, "--salt-env", "TENANT_ONE")
    assert _encodes(settings, "model-a", "tenant-one", RED) == 1
    assert _encodes(settings, "model-a", "tenant-two", RED) == 0
    assert _encodes(settings, "model-a", None, RED) == 0


def test_a_namespace_purged_loses_every_tenants_entries(tier: tuple[TierSettings, list[str]]) -> None:
    settings, where = tier
    _fill(settings)
    _purge(where, "--namespace", "model-a")
    for salt in (None, "tenant-one", "tenant-two"):
        assert _encodes(settings, "model-a", salt, RED) == 1
    assert _encodes(settings, "model-b", None, RED) == 0


def test_a_dry_run_removes_nothing(
    tier: tuple[TierSettings, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    settings, where = tier
    _fill(settings)
    _purge(where, "--namespace", "model-b", "--dry-run")
    assert "would remove 1 entries" in capsys.readouterr().out
    assert _encodes(settings, "model-b", None, RED) == 0


def test_a_purge_selects_something_and_reads_secrets_from_the_environment_only() -> None:
    with pytest.raises(ConfigurationError, match="needs a namespace"):
        PurgeSelection()
    assert main(["purge", "--disk", "/nonexistent", "--salt-env", "UNSET_VARIABLE_X"]) == 2


def test_discard_images_removes_memory_and_tier_copies_under_every_secret(
    tier: tuple[TierSettings, list[str]],
) -> None:
    settings, _ = tier
    calls: list[int] = []
    cache = _cache(settings, salt="tenant-one")
    cache.encode_images([RED, GREEN], _encoder(calls))
    assert cache.discard_images([RED]) >= 2  # memory and the tier
    cache.encode_images([RED, GREEN], _encoder(calls))
    assert calls == [2, 1]  # RED encoded again, GREEN still held
    cache.close()
    assert _encodes(settings, "model-a", "tenant-one", GREEN) == 0


def test_tenant_views_share_one_budget_and_no_entry(tier: tuple[TierSettings, list[str]]) -> None:
    settings, _ = tier
    calls: list[int] = []
    cache = _cache(settings)
    one, two = cache.with_salt("tenant-one"), cache.with_salt("tenant-two")
    one.encode_images([RED], _encoder(calls))
    two.encode_images([RED], _encoder(calls))  # the other tenant encodes it too
    one.encode_images([RED], _encoder(calls))
    assert calls == [1, 1]
    assert cache.snapshot().levels["embedding"].entries == 2  # one store, both tenants' entries
    cache.close()
    assert _encodes(settings, "model-a", "tenant-two", RED) == 0
