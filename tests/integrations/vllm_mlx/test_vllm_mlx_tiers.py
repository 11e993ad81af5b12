"""``visioncache serve-mlx`` with a Redis tier and a secret: every entry it writes is signed, and a
reader holding another secret treats it as a miss (the real server, a real redis-server)."""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import pytest

from tests.integrations.vllm_mlx.chat import client_for, complete, image_url, user_message
from tests.support.tier_reads import load
from tests.support.vllm_mlx_server import ServerProcess
from tests.tiers.conftest import RedisProcess, redis_process_factory, redis_server
from visioncache import TierSettings, VisionEmbeddingCache
from visioncache.errors import UnverifiableEntryError
from visioncache.tiers import UnsignedTierWarning
from visioncache.tiers.namespaces import NAMESPACE_PREFIX, namespace_name
from visioncache.tiers.serialization import loads

redis = pytest.importorskip("redis")

__all__ = ["redis_process_factory", "redis_server"]  # the fixtures this module uses

SECRET = "serve-mlx-secret"
PREFIX = "vc-serve-mlx:"


def blob_auth(blob: bytes) -> str:
    """How a stored blob is authenticated, from its safetensors header (``hmac-sha256`` or ``none``)."""
    (length,) = struct.unpack("<Q", blob[:8])
    metadata: dict[str, str] = json.loads(blob[8 : 8 + length])["__metadata__"]
    return metadata["auth"]


def reader(url: str, namespace: str, *secrets: bytes) -> VisionEmbeddingCache:
    settings = TierSettings(redis_url=url, redis_prefix=PREFIX, secrets=secrets, max_pending_write_bytes=0)
    return VisionEmbeddingCache(namespace=namespace, tiers=settings)


@pytest.mark.slow
def test_regression_serve_mlx_signs_every_redis_entry_with_its_secret(
    model_dir: Path, tmp_path: Path, redis_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve-mlx --vision-cache-redis-url`` built an unsigned Redis tier and had no flag to sign it
    (#19.2): anyone who could write to the server could plant features every replica served."""
    monkeypatch.setenv("VC_TEST_SECRET", SECRET)  # the server inherits it; the flag names it
    flags = ["--vision-cache-redis-url", redis_server.url, "--vision-cache-redis-prefix", PREFIX]
    image = image_url(501)
    with ServerProcess(
        "visioncache", model_dir, tmp_path, *flags, "--vision-cache-hmac-secret-env", "VC_TEST_SECRET"
    ) as server:
        complete(client_for(server.base_url), [user_message("describe the image", image)])
    log = server.log_tail(100_000)  # stopped: its queued writes were flushed on the way out

    client = redis.Redis.from_url(redis_server.url)
    keys = [key.decode()[len(PREFIX) :] for key in client.scan_iter(match=PREFIX + "*")]
    records = [key for key in keys if key.startswith(NAMESPACE_PREFIX)]
    entries = [key for key in keys if not key.startswith(NAMESPACE_PREFIX)]
    assert len(records) == 1 and entries, keys
    assert {blob_auth(client.get(PREFIX + key)) for key in entries} == {"hmac-sha256"}
    assert "UnsignedTierWarning" not in log

    namespace = namespace_name(client.get(PREFIX + records[0]))
    assert namespace is not None
    with reader(redis_server.url, namespace, SECRET.encode()) as same_secret:
        assert same_secret.get_image_embeddings([image])[0] is not None  # the server's own entry
        key = same_secret.key("embedding", [image])
        assert key is not None and same_secret.tiers is not None
        stored = client.get(PREFIX + same_secret.tiers.tier_keys(key)[0])
    with pytest.raises(UnverifiableEntryError):  # found under its key, a blob still fails another secret
        loads(stored, secret=b"another-secret", context=key)
    with reader(redis_server.url, namespace, b"another-secret") as other_secret:
        assert other_secret.get_image_embeddings([image]) == [None]
        assert other_secret.snapshot().tiers is not None
        assert other_secret.snapshot().tiers.tier("redis").hits == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsignedTierWarning)
        with reader(redis_server.url, namespace) as unsigned:
            unsigned_tiers = unsigned.tiers
            assert unsigned_tiers is not None
            assert load(unsigned_tiers, key) is None  # an unsigned reader never accepts a signed blob


def test_install_options_and_flags_build_the_same_tier_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from visioncache import ConfigurationError
    from visioncache.integrations.vllm_mlx import VisionCacheSettings
    from visioncache.integrations.vllm_mlx.launcher import build_parser

    expected = TierSettings(disk_dir=str(tmp_path), redis_ttl=60, secrets=(SECRET.encode(),))
    options = VisionCacheSettings.from_options(
        model_id="m", disk_dir=str(tmp_path), redis_ttl=60, secrets=[SECRET.encode()]
    )
    monkeypatch.setenv("VC_TEST_SECRET", SECRET)
    flags = ["--vision-cache-model-id", "m", "--vision-cache-disk-dir", str(tmp_path)]
    flags += ["--vision-cache-redis-ttl", "60"]
    flags += ["--vision-cache-hmac-secret-env", "VC_TEST_SECRET"]
    parsed = VisionCacheSettings.from_args(build_parser().parse_args(flags), model_path=None)
    assert options.tiers == parsed.tiers == expected
    monkeypatch.setenv("VISIONCACHE_DISK_DIR", str(tmp_path))
    from_env = VisionCacheSettings.from_options(model_id="m", tiers_from_env=True)
    assert from_env.tiers == TierSettings(disk_dir=str(tmp_path))
    with pytest.raises(ConfigurationError, match="either from the environment"):
        VisionCacheSettings.from_options(model_id="m", tiers_from_env=True, disk_dir=str(tmp_path))
