"""Tiers from VISIONCACHE_* settings: parsed strictly, and nothing is opened by reading them."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.support.optional import needs_redis
from tests.support.tier_reads import load
from visioncache import VisionEmbeddingCache
from visioncache.errors import ConfigurationError
from visioncache.tiers.config import chain_from_env
from visioncache.tiers.disk import DiskTier

KEY = "0123456789abcdef/embedding/" + "cd" * 32
VALUE = np.arange(12, dtype=np.float32).reshape(3, 4)


def environment(tmp_path: Path) -> dict[str, str]:
    return {
        "VISIONCACHE_DISK_DIR": str(tmp_path / "disk"),
        "VISIONCACHE_DISK_MAX_BYTES": "3MiB",
        "VISIONCACHE_REDIS_URL": "redis://127.0.0.1:1/0",
        "VISIONCACHE_REDIS_PREFIX": "vc-test:",
        "VISIONCACHE_REDIS_TTL": "60",
        "VISIONCACHE_REDIS_TIMEOUT": "0.1",
        "VISIONCACHE_HMAC_SECRET": "k",
        "VISIONCACHE_HMAC_PREVIOUS_SECRETS": "j, i",
    }


@needs_redis
def test_from_env_builds_the_tiers_it_names(tmp_path: Path) -> None:
    assert chain_from_env(environ={}) is None
    chain = chain_from_env(environ=environment(tmp_path))
    assert chain is not None
    disk, remote = chain.tiers
    assert (remote.name, remote.key_prefix, remote.ttl_seconds) == ("redis", "vc-test:", 60)  # type: ignore[attr-defined]
    assert len(chain.tier_keys(KEY)) == 3  # the current secret and two previous ones
    assert chain.save(KEY, VALUE)  # nothing listens on port 1: Redis fails, disk stores
    assert disk.sizes().max_bytes == 3 * 2**20
    assert np.array_equal(load(chain, KEY), VALUE)
    assert chain.stats().tier("redis").errors == 1  # then its breaker skips it
    chain.close()


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("VISIONCACHE_DISK_MAX_BYTES", "2 parsecs"),
        ("VISIONCACHE_REDIS_TTL", "soon"),
        ("VISIONCACHE_REDIS_TIMEOUT", "nan"),
        ("VISIONCACHE_REDIS_TIMEOUT", "-1"),
        ("VISIONCACHE_RETRY_INTERVAL", "inf"),
        ("VISIONCACHE_DISK_TIMEOUT", "0"),
        ("VISIONCACHE_REDIS_CLUSTER", "maybe"),
        pytest.param("VISIONCACHE_REDIS_URL", "redis://host:notaport/0", marks=needs_redis),
        ("VISIONCACHE_MAX_PENDING_WRITE_BYTES", "lots"),
    ],
)
def test_every_setting_that_does_not_parse_is_a_configuration_error(
    tmp_path: Path, name: str, bad: str
) -> None:
    with pytest.raises(ConfigurationError, match=name.removeprefix("VISIONCACHE_")):
        chain_from_env(environ={**environment(tmp_path), name: bad})


def test_a_disk_dir_that_is_a_file_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    with pytest.raises(ConfigurationError, match="DISK_DIR"):
        chain_from_env(environ={"VISIONCACHE_DISK_DIR": str(path)})
    with pytest.raises(ConfigurationError, match="not a directory"):
        DiskTier(path)


def test_previous_secrets_need_a_current_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="HMAC_SECRET"):
        chain_from_env(
            environ={"VISIONCACHE_DISK_DIR": str(tmp_path), "VISIONCACHE_HMAC_PREVIOUS_SECRETS": "a"}
        )


def test_constructing_a_cache_with_disk_dir_set_creates_nothing_and_starts_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: `VisionEmbeddingCache()` read VISIONCACHE_*, created a database, wrote a
    namespace record and started a writer thread."""
    directory = tmp_path / "disk"
    monkeypatch.setenv("VISIONCACHE_DISK_DIR", str(directory))
    threads = threading.active_count()
    plain = VisionEmbeddingCache()
    assert plain.tiers is None and not directory.exists() and threading.active_count() == threads
    from_env = VisionEmbeddingCache.from_env()
    assert from_env.tiers is not None and not directory.exists()  # configured, not yet opened
    assert threading.active_count() == threads
    from_env.encode_images([b"\x89PNG\r\n\x1a\n" + bytes(16)], lambda images: [VALUE for _ in images])
    assert from_env.tiers.flush(timeout=30)
    assert directory.is_dir() and threading.active_count() == threads + 1  # the writer, at first use
    from_env.close()
    assert threading.active_count() == threads
