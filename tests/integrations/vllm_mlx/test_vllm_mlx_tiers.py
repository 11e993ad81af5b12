"""``visioncache serve-mlx`` with a Redis tier and a secret: every entry it writes is signed, and a
reader holding another secret treats it as a miss (the real server, a real redis-server)."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_mlx.chat import Conversation, client_for, complete, image_url, user_message
from tests.support.tier_reads import load
from tests.support.vllm_mlx_server import ServerProcess
from tests.tiers.conftest import RedisProcess, redis_process_factory, redis_server
from visioncache import TierSettings, VisionEmbeddingCache
from visioncache.errors import UnverifiableEntryError
from visioncache.tiers import UnsignedTierWarning, tensor_file
from visioncache.tiers.namespaces import NAMESPACE_PREFIX, namespace_name
from visioncache.tiers.serialization import MAGIC, loads

redis = pytest.importorskip("redis")

__all__ = ["redis_process_factory", "redis_server"]  # the fixtures this module uses

SECRET = "serve-mlx-secret"
PREFIX = "vc-serve-mlx:"


def blob_auth(blob: bytes) -> str:
    """How a stored blob says it is authenticated (``hmac-sha256`` or ``none``): the metadata of
    the safetensors file behind the blob's magic and digest."""
    metadata, _ = tensor_file.unpack(memoryview(blob)[len(MAGIC) + 32 :])
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


def send_together(
    server: ServerProcess, chats: list[Conversation], text: str, images: list[str | None]
) -> None:
    """Each chat's next turn (``text``, and its image where one is given), sent concurrently, the
    engine held until all are queued (`ServerProcess.hold`): they reach one scheduler step."""
    client = client_for(server.base_url)

    def send(index: int) -> Any:
        image = images[index]
        return chats[index].send(client, text, *([image] if image is not None else []))

    with server.hold(len(chats)), ThreadPoolExecutor(len(chats)) as pool:
        list(pool.map(send, range(len(chats))))


def tower_images(server: ServerProcess, since: int) -> list[int]:
    """Images per vision-tower call the server recorded after its first ``since`` calls."""
    return [entry["images"] for entry in server.records("tower")[since:]]


@pytest.mark.slow
@pytest.mark.parametrize("prefill", ["whole", "chunked"])
def test_regression_serve_mlx_chats_store_their_features_so_a_restart_encodes_none_of_their_images(
    model_dir: Path, tmp_path: Path, prefill: str
) -> None:
    """The features of the images of a chat request were still lazy on vllm-mlx's generation
    stream when the tier writer (another thread) serialised them: none reached the disk tier
    ("not storing ... There is no Stream(cpu, 1) in current thread" in the log, every time images
    of several requests shared a tower call), and a server restarted on the same directory
    encoded every one of them again."""
    flags = ["--vision-cache-disk-dir", str(tmp_path / "tier")]
    flags += ["--chunked-prefill-tokens", "64"] if prefill == "chunked" else []
    chats = [Conversation() for _ in range(4)]
    with ServerProcess("visioncache", model_dir, tmp_path / "first", *flags) as server:
        started = len(server.records("tower"))  # the family's self-check at start is not counted
        for turn in range(2):
            send_together(
                server,
                chats,
                f"describe image {turn + 1}",
                [image_url(700 + 10 * turn + chat) for chat in range(4)],
            )
        first = tower_images(server, started)
    log = server.log_tail(10_000_000)  # stopped: its queued writes were flushed on the way out
    assert sum(first) == 8 and max(first) > 1, first  # several chats' images in one tower call
    assert "not storing" not in log and "There is no Stream" not in log
    # A fresh HOME: nothing carries over but the disk tier. The chats go on with a text-only turn
    # whose history holds all 8 images.
    with ServerProcess("visioncache", model_dir, tmp_path / "restarted", *flags) as server:
        started = len(server.records("tower"))
        send_together(server, chats, "and now?", [None] * len(chats))
        assert tower_images(server, started) == []
        stats = server.get_json("/v1/cache/stats")["engine_cache"]["vision_embedding_cache"]
    assert stats["vision_tower_calls"] == 0 and stats["images_encoded"] == 0
    assert stats["image_requests"] == 4 and stats["image_request_errors"] == 0
    assert "not storing" not in server.log_tail(10_000_000)
