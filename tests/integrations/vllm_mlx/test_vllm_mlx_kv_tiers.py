"""Image-aware KV prefixes in the tiers (#32): a running chat continues on a restarted server (same
disk tier) or on another server (same Redis) by prefilling only its new tail, with stock vllm-mlx's
tokens and top log-probs; the KV disk tier stays within ``--vision-cache-max-kv-bytes``; a
damaged KV blob is recomputed, never served; another tenant gets none. Real servers (vllm-mlx's
OpenAI server on mlx-cpu, the tiny random-weight Qwen2-VL), the real ``openai`` client, a real
redis-server.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_mlx.chat import Conversation, Reply, client_for, image_png, image_url
from tests.integrations.vllm_mlx.test_vllm_mlx_server import Recording, engine_stats, scrape
from tests.support.vllm_mlx_server import ServerProcess
from tests.tiers.conftest import RedisProcess, redis_process_factory, redis_server
from visioncache.integrations.vllm_mlx.kv_tiers import KV_DIRECTORY
from visioncache.tiers import DiskTier

pytestmark = pytest.mark.slow

__all__ = ["redis_process_factory", "redis_server"]  # the fixtures this module uses

# A chat of three turns: two images, one in each of the first two turns, then a text-only turn.
TURNS = (("describe the image", (0,)), ("compare the image and the picture", (1,)), ("and now?", ()))
SECRET_VARIABLE = "VC_KV_TEST_SECRET"


def send_turns(
    server: ServerProcess, chat: Conversation, turns: Any, images: list[str]
) -> list[tuple[Reply, int]]:
    """Each turn's reply, and the KV tokens the server reused for it."""
    client, results = client_for(server.base_url), []
    for text, picks in turns:
        before = engine_stats(server).get("kv_tokens_reused", 0)
        reply = chat.send(client, text, *[images[index] for index in picks])
        results.append((reply, engine_stats(server).get("kv_tokens_reused", 0) - before))
    return results


def stock_chat(server: ServerProcess, images: list[str]) -> tuple[list[Reply], list[dict[str, Any]]]:
    """The whole chat on the stock server: its replies and recorded tokens (with top log-probs)."""
    recording = Recording(server)
    replies = [reply for reply, _ in send_turns(server, Conversation(), TURNS, images)]
    return replies, recording.tokens()


def continued(
    first: ServerProcess, second: ServerProcess, images: list[str], *, stop_first: bool = True
) -> tuple[list[tuple[Reply, int]], list[dict[str, Any]], dict[str, Any]]:
    """Turns 1-2 on ``first``, turn 3 on ``second`` (started after ``first`` wrote behind);
    every turn's (reply, KV tokens reused), the tokens both recorded, and ``second``'s stats."""
    chat, tokens = Conversation(), []
    with first:
        recording = Recording(first)
        results = send_turns(first, chat, TURNS[:2], images)
        tokens += recording.tokens()
        if not stop_first:  # its writes flushed: the other server may read them now
            wait_for_writes(first)
            return _on_second(second, chat, images, results, tokens)
    return _on_second(second, chat, images, results, tokens)


def _on_second(
    second: ServerProcess,
    chat: Conversation,
    images: list[str],
    results: list[tuple[Reply, int]],
    tokens: list[dict[str, Any]],
) -> tuple[list[tuple[Reply, int]], list[dict[str, Any]], dict[str, Any]]:
    with second:
        recording = Recording(second)
        results += send_turns(second, chat, TURNS[2:], images)
        tokens += recording.tokens()
        wait_for_writes(second)  # its stats and metrics then count the same bytes
        metrics = scrape(second) if "--enable-metrics" in second.command else {}
        return results, tokens, engine_stats(second) | {"towers": recording.towers(), "metrics": metrics}


def wait_for_writes(server: ServerProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while engine_stats(server)["kv_tier_writes_pending"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine_stats(server)["kv_tier_writes_pending"] == 0


def kv_disk(tier: Path) -> DiskTier:
    return DiskTier(tier / KV_DIRECTORY)


def kv_entries(tier: DiskTier) -> list[str]:
    """The KV prefixes a KV disk tier holds (not their block pointers)."""
    stored = list(tier.keys())
    return [key for key in stored if key.startswith("kv/")]


def test_restart_on_the_same_disk_tier_prefills_only_the_new_tail_and_matches_stock(
    stock_server: ServerProcess, model_dir: Path, tmp_path: Path
) -> None:
    images = [image_url(900), image_url(901)]
    stock_replies, stock_tokens = stock_chat(stock_server, images)
    flags = ["--vision-cache-disk-dir", str(tmp_path / "tier"), "--enable-metrics"]
    first = ServerProcess("visioncache", model_dir, tmp_path / "first", *flags)
    restarted = ServerProcess("visioncache", model_dir, tmp_path / "restarted", *flags)  # a fresh HOME
    results, tokens, stats = continued(first, restarted, images)
    replies = [reply for reply, _ in results]
    assert replies == stock_replies
    assert len(tokens) == len(stock_tokens) > 0 and all("top" in entry for entry in tokens)
    assert tokens == stock_tokens  # greedy tokens and top-5 log-probs, bit for bit
    # The restarted server's first request reused the whole previous turn: only its tail prefilled.
    reused = results[2][1]
    assert reused >= replies[1].prompt_tokens, (reused, replies)
    assert stats["kv_tier_restores"] == 1 and stats["kv_tier_tokens_restored"] >= replies[1].prompt_tokens
    assert stats["towers"] == [] and stats["kv_tier_corrupt"] == 0
    assert 0 < stats["kv_tier_bytes"] <= stats["kv_tier_max_bytes"] == 2**30
    # The same on vllm-mlx's Prometheus endpoint (--enable-metrics).
    metrics = stats["metrics"]
    assert metrics["visioncache_vllm_mlx_kv_tier_restores_total", ""] == 1
    assert metrics["visioncache_vllm_mlx_kv_tier_bytes", ""] == stats["kv_tier_bytes"]


def test_a_second_server_sharing_redis_prefills_only_the_new_tail(
    stock_server: ServerProcess, model_dir: Path, tmp_path: Path, redis_server: RedisProcess
) -> None:
    images = [image_url(910), image_url(911)]
    stock_replies, stock_tokens = stock_chat(stock_server, images)
    flags = ["--vision-cache-redis-url", redis_server.url, "--vision-cache-redis-prefix", "vc-kv-test:"]
    flags += ["--vision-cache-hmac-secret-env", SECRET_VARIABLE]
    environment = {SECRET_VARIABLE: "kv-secret"}
    first = ServerProcess("visioncache", model_dir, tmp_path / "a", *flags, environment=environment)
    second = ServerProcess("visioncache", model_dir, tmp_path / "b", *flags, environment=environment)
    results, tokens, stats = continued(first, second, images, stop_first=False)
    replies = [reply for reply, _ in results]
    assert replies == stock_replies and tokens == stock_tokens
    assert results[2][1] >= replies[1].prompt_tokens, results
    assert stats["kv_tier_restores"] == 1 and stats["towers"] == []


def test_a_corrupted_kv_blob_on_disk_is_recomputed_never_served(
    stock_server: ServerProcess, model_dir: Path, tmp_path: Path
) -> None:
    images = [image_url(920), image_url(921)]
    stock_replies, stock_tokens = stock_chat(stock_server, images)
    flags = ["--vision-cache-disk-dir", str(tmp_path / "tier")]
    chat = Conversation()
    with ServerProcess("visioncache", model_dir, tmp_path / "first", *flags) as first:
        results = send_turns(first, chat, TURNS[:2], images)
    tier = kv_disk(tmp_path / "tier")
    entries = kv_entries(tier)
    assert len(entries) == 1  # the chat's latest prefix (its first turn's was superseded)
    for key in entries:  # one bit flipped in the middle of the layers' bytes
        blob = bytearray(tier.get(key) or b"")
        blob[len(blob) // 2] ^= 0x01
        tier.put(key, bytes(blob))
    tier.close()
    restarted = ServerProcess("visioncache", model_dir, tmp_path / "restarted", *flags)
    results, tokens, stats = _on_second(restarted, chat, images, results, [])
    replies = [reply for reply, _ in results]
    assert replies == stock_replies
    assert results[2][1] == 0  # nothing reused: the damaged prefix was recomputed
    assert stats["kv_tier_corrupt"] == 1 and stats["kv_tier_restores"] == 0
    assert tokens == stock_tokens[-len(tokens) :]
    tier = kv_disk(tmp_path / "tier")
    assert entries[0] not in kv_entries(tier)  # deleted
    tier.close()


def test_kv_bytes_on_disk_and_in_redis_never_exceed_the_budget(
    model_dir: Path, tmp_path: Path, redis_server: RedisProcess
) -> None:
    """Six chats' prefixes (~100 KiB each for the tiny model) into a 256 KiB budget: after each
    write the KV disk tier, and the KV values in Redis, hold at most the budget, least recently
    used prefixes evicted; the embedding entries live in the tiers' own folder, prefix and budget."""
    import redis

    budget = 256 * 1024
    flags = ["--vision-cache-disk-dir", str(tmp_path / "tier"), "--vision-cache-max-kv-bytes", "256KiB"]
    flags += ["--vision-cache-redis-url", redis_server.url, "--vision-cache-redis-prefix", "vc-kv-budget:"]
    client = redis.Redis.from_url(redis_server.url)

    def in_redis() -> dict[bytes, int]:  # the KV values Redis holds, by key
        return {name: int(client.strlen(name)) for name in client.scan_iter(match="vc-kv-budget:kv:*")}

    chats = 6
    with ServerProcess("visioncache", model_dir, tmp_path / "server", *flags) as server:
        for index in range(chats):
            send_turns(server, Conversation(), TURNS[:1], [image_url(930 + index)])
            wait_for_writes(server)
            stats = engine_stats(server)
            assert 0 < stats["kv_tier_bytes"] <= stats["kv_tier_max_bytes"] == budget, (index, stats)
            assert 0 < sum(in_redis().values()) <= budget, (index, in_redis())
    assert stats["kv_tier_writes"] == chats and stats["kv_tier_writes_skipped"] == 0
    tier = kv_disk(tmp_path / "tier")
    sizes, kept = tier.sizes(), kv_entries(tier)
    tier.close()
    assert sizes.bytes is not None and sizes.bytes <= budget
    assert 0 < len(kept) < chats  # some evicted
    files = sum(path.stat().st_size for path in (tmp_path / "tier" / KV_DIRECTORY).rglob("*.val"))
    assert 0 < files <= budget  # the value files themselves, on disk
    entries = [name for name in in_redis() if name.startswith(b"vc-kv-budget:kv:kv/")]
    assert 0 < len(entries) < chats, in_redis()  # Redis evicted some too
    client.close()


def test_another_tenant_restarted_on_the_same_disk_tier_gets_no_kv(
    stock_server: ServerProcess, model_dir: Path, tmp_path: Path
) -> None:
    images = [image_url(940), image_url(941)]
    stock_replies, stock_tokens = stock_chat(stock_server, images)
    flags = ["--vision-cache-disk-dir", str(tmp_path / "tier"), "--vision-cache-salt-env", SECRET_VARIABLE]
    first = ServerProcess(
        "visioncache", model_dir, tmp_path / "a", *flags, environment={SECRET_VARIABLE: "a"}
    )
    other = ServerProcess(
        "visioncache", model_dir, tmp_path / "b", *flags, environment={SECRET_VARIABLE: "b"}
    )
    results, tokens, stats = continued(first, other, images)
    assert [reply for reply, _ in results] == stock_replies and tokens == stock_tokens
    assert results[2][1] == 0  # tenant b's first request reused nothing of tenant a's chat
    assert stats["kv_tier_restores"] == 0 and stats["kv_tier_misses"] >= 1
    assert stats["kv_tier_corrupt"] == 0  # a's prefix is not b's to read: a miss, not damage
    tier = kv_disk(tmp_path / "tier")
    assert len(kv_entries(tier)) == 2  # a's prefix stays, beside b's
    tier.close()


def test_deleting_an_image_drops_its_tenants_kv_prefixes_from_the_tiers(
    model_dir: Path, tmp_path: Path
) -> None:
    """``DELETE /v1/visioncache/images/{handle}`` promises the KV prefixes holding the image go:
    in the tiers too (all of the tenant's: the tiers cannot tell which hold it unread)."""
    import requests

    from tests.integrations.vllm_mlx.test_vllm_mlx_handles import handle_of

    flags = ["--vision-cache-disk-dir", str(tmp_path / "tier")]
    with ServerProcess("visioncache", model_dir, tmp_path / "server", *flags) as server:
        handle = handle_of(server, image_png(950))
        send_turns(server, Conversation(), TURNS[:2], [handle, image_url(951)])
        wait_for_writes(server)
        tier = kv_disk(tmp_path / "tier")
        assert len(kv_entries(tier)) == 1
        response = requests.delete(server.base_url + "/v1/visioncache/images/" + handle, timeout=120)
        assert response.status_code == 200, response.text
        assert response.json()["kv_prefixes"] >= 2  # the engine's copy, and the tier's
        stored = list(tier.keys())
        assert not [key for key in stored if key.startswith(("kv/", "kvp/"))], stored
        tier.close()
