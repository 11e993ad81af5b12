"""serve-mlx's tenant map and its start-up checks (`tenants`, `settings`), the shared-cache warning,
and the KV purge of `forget`, without a server."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.threads import run_threads
from visioncache import ConfigurationError
from visioncache.integrations.vllm_mlx import VisionCacheSettings
from visioncache.integrations.vllm_mlx.forget import forget_kv
from visioncache.integrations.vllm_mlx.kv_keys import prefix_key
from visioncache.integrations.vllm_mlx.tenants import TenantKeys, warn_if_shared
from visioncache.tiers import TierSettings


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", "{}", '{"key": ""}', '{"key": 3}', '{"": "secret"}'],
)
def test_a_tenant_map_that_is_not_api_keys_to_secrets_is_refused_at_start(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"tenant|JSON"):
        TenantKeys.from_text(text, "the test's map")


def test_keys_map_to_their_tenant_and_unknown_keys_to_none(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"a1": "tenant-a", "a2": "tenant-a", "b": "tenant-b"}))
    tenants = TenantKeys.from_file(str(path))
    assert [tenants.secret_of(key) for key in ("a1", "a2", "b", "a", "a1 ")] == [
        "tenant-a",
        "tenant-a",
        "tenant-b",
        None,
        None,
    ]
    with pytest.raises(ConfigurationError, match="unset or empty"):
        TenantKeys.from_env("VISIONCACHE_TEST_UNSET_TENANTS")


def test_one_salt_and_tenants_by_key_exclude_each_other() -> None:
    with pytest.raises(ConfigurationError, match="not \\['salt', 'tenants_env'\\]"):
        VisionCacheSettings(model_id="m", salt="s", tenants_env="VAR")


def test_a_shared_tier_without_tenants_warns_plainly(caplog: pytest.LogCaptureFixture) -> None:
    tenants = TenantKeys({"a": "tenant-a"})
    with caplog.at_level(logging.WARNING):
        warn_if_shared(True, None, None)
        warns = [record.message for record in caplog.records]
        warn_if_shared(True, tenants, None)  # tenants: nothing shared
        warn_if_shared(True, None, "one-tenant")  # one tenant: its clients share by choice
        warn_if_shared(False, None, None)  # memory only: nothing outlives the process
    assert len(caplog.records) == 1 and "ALL CLIENTS SHARE ONE CACHE" in warns[0]
    assert TierSettings(disk_dir="/tmp/x").configured  # what `Installation` passes as shared_tier


class _PrefixCache:
    """vllm-mlx's MemoryAwarePrefixCache as `forget_kv` reads it: ``_entries`` and ``remove``."""

    def __init__(self, keys: list[tuple[int, ...]]) -> None:
        self._entries = dict.fromkeys(keys)

    def remove(self, tokens: list[int], *, include_ssd: bool = False) -> bool:
        assert include_ssd
        return self._entries.pop(tuple(tokens), object()) is None


def _key(digest: bytes, salt: str | None, start: int = 3) -> tuple[int, ...]:
    tokens = [5] * start + [9] * 4 + [6, 7]
    return prefix_key(tokens, 9, [(digest, 4)], namespace="ns", salt=salt).key


def test_forgetting_an_image_removes_the_tenants_kv_prefixes_that_hold_it_and_no_other() -> None:
    red, green = b"r" * 32, b"g" * 32
    keys = [_key(red, "a"), _key(red, "a", start=5), _key(red, "b"), _key(green, "a"), _key(red, None)]
    cache: Any = SimpleNamespace(_inner=_PrefixCache(keys))
    assert forget_kv(cache, "ns", "a", red) == 2
    assert list(cache._inner._entries) == keys[2:]
    assert forget_kv(cache, "ns", None, red) == 1


def test_each_request_keeps_its_tenant_under_threads_at_a_1us_switch_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from visioncache.integrations.vllm_mlx import install
    from visioncache.integrations.vllm_mlx.tenants import current

    monkeypatch.setenv("VC_TEST_TENANTS", json.dumps({f"key-{n}": f"tenant-{n}" for n in range(8)}))
    installation = install(VisionCacheSettings(model_id="m", tenants_env="VC_TEST_TENANTS", handles=False))
    wrong: list[str] = []

    def client(number: int) -> None:
        current.set(f"tenant-{number}")  # what the middleware sets for the thread's requests
        for index in range(300):
            request_id = f"{number}-{index}"
            installation.note_request(request_id)
            request = SimpleNamespace(request_id=request_id)
            if installation.tenant_of(request) != f"tenant-{number}" or installation.tenant_of(request) != (
                f"tenant-{number}"
            ):
                wrong.append(request_id)

    try:
        run_threads(client, 8)
    finally:
        installation.uninstall()
    assert wrong == []
    assert installation.tenant_of(SimpleNamespace(request_id="never-noted")) is None  # no key: no tenant


def test_purge_by_handle_removes_the_tenants_kept_bytes_and_features_from_the_disk_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from visioncache import ContentDigest, VisionEmbeddingCache
    from visioncache.cli import main
    from visioncache.integrations.handles.handles import Handles

    tiers = TierSettings(disk_dir=str(tmp_path / "tier"), max_pending_write_bytes=0)
    image = b"\x89PNG image bytes of tenant a"
    handles = Handles("tenant-a", tiers, "1MiB")
    ((handle, digest),) = handles.issue([image])
    features = VisionEmbeddingCache(namespace="model", tiers=tiers).with_salt("tenant-a")
    features.set_image_embeddings([ContentDigest(digest)], [np.ones((2, 2), np.float32)])
    features.close()
    handles.close()
    monkeypatch.setenv("TENANT_A", "tenant-a")
    assert (
        main(["purge", "--disk", str(tmp_path / "tier"), "--handle", handle, "--salt-env", "TENANT_A"]) == 0
    )
    reopened = Handles("tenant-a", tiers, "1MiB")
    assert reopened.kept_bytes(digest) is None
    cache = VisionEmbeddingCache(namespace="model", tiers=tiers).with_salt("tenant-a")
    assert cache.get_image_embeddings([ContentDigest(digest)]) == [None]
    assert (
        main(["purge", "--disk", str(tmp_path / "tier"), "--handle", handle]) == 2
    )  # not the public tenant's
