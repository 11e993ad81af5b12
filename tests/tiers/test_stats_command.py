"""`visioncache stats` on a disk and a Redis tier: entries, bytes, namespaces."""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("redis", "redis")

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from visioncache.cli import main
from visioncache.errors import ConfigurationError
from visioncache.identity.keys import KeyBuilder
from visioncache.tiers.base import Tier
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.redis import RedisTier


def fill(tier: Tier) -> tuple[KeyBuilder, KeyBuilder]:
    first, second = KeyBuilder("qwen2-vl/a"), KeyBuilder("qwen2-vl/b")
    chain = TierChain([tier])
    for builder in (first, second):
        chain.register_namespace(builder.tag, builder.namespace)
    for index in range(3):
        chain.save(first.key("embedding", [bytes([index]) * 32]), np.zeros(1000, np.float32))
    chain.save(second.key("pixel_only", [bytes(32)]), np.zeros(10, np.float32))
    assert chain.flush(timeout=30)  # namespace records are written in the background
    return first, second


def check(output: str, first: KeyBuilder, second: KeyBuilder) -> None:
    assert "4 entries" in output.splitlines()[0]
    assert "namespaces: 2" in output
    assert f"{first.tag}  qwen2-vl/a  3 entries  embedding=3" in output
    assert f"{second.tag}  qwen2-vl/b  1 entries  pixel_only=1" in output


def test_stats_on_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tier = DiskTier(tmp_path / "disk", 2**24)
    first, second = fill(tier)
    tier.close()
    assert main(["stats", "--disk", str(tmp_path / "disk")]) == 0
    check(capsys.readouterr().out, first, second)
    assert DiskTier(tmp_path / "disk").sizes().max_bytes == 2**24  # the limit was not changed


def test_stats_on_redis(redis_server: Any, redis_prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = fill(RedisTier(redis_server.url, key_prefix=redis_prefix))
    assert main(["stats", "--redis", redis_server.url, "--prefix", redis_prefix]) == 0
    output = capsys.readouterr().out
    check(output, first, second)
    assert " 0 bytes" not in output


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        from visioncache.commands import stats

        stats.run(type("Args", (), {"disk": str(tmp_path / "none"), "redis": None})())
    assert main(["stats", "--disk", str(tmp_path / "none")]) == 2


def test_unreachable_redis_is_a_message_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.tiers.conftest import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert main(["stats", "--redis", url]) == 2
    error = capsys.readouterr().err
    assert f"cannot read redis tier {url}" in error and "Traceback" not in error
