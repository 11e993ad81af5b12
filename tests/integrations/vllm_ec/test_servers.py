"""Two vLLM OpenAI servers sharing one redis-server: replicas reuse each other's encoder outputs,
and a Redis that dies mid-workload costs no request and changes no output.

The reference is a third server without the connector, sent the same requests in the same order
through the same client: like is compared with like. An in-process engine is no reference for a
server: its worker runs on other cores with other threads (vLLM reserves a core for the scheduler
process only when the engine is multiprocess), and each reply's text comes back by another route
(decoded in process vs rebuilt from a stream) to be fed back as the next turn's history. With a
random-weight model whose greedy margins are a single bf16 step (sometimes an exact tie), any such
difference changes tokens; none of it has anything to do with the connector.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_ec.conftest import ec_config
from tests.integrations.vllm_ec.servers import VllmServer, chat
from tests.integrations.vllm_ec.workload import MAIN, OTHER
from tests.tiers.conftest import RedisProcess

RETRY_INTERVAL = 2.0


@pytest.fixture(scope="module")
def servers(
    tiny_model: Path, redis_server: RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, VllmServer]]:
    """Replicas A and B (the same model and connector configuration, Redis as the only tier) and
    a stock server (no connector), started together."""
    workdir = tmp_path_factory.mktemp("replicas")
    config = ec_config(redis_url=redis_server.url, retry_interval=RETRY_INTERVAL)
    started = {
        name: VllmServer(tiny_model, workdir, ec, name=name).start()
        for name, ec in (("a", config), ("b", config), ("stock", None))
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def replicas(servers: dict[str, VllmServer]) -> tuple[VllmServer, VllmServer]:
    return servers["a"], servers["b"]


@pytest.fixture(scope="module")
def stock_server(servers: dict[str, VllmServer]) -> dict[str, list[Any]]:
    """What the stock server answers to each workload, sent whole, in the replicas' order."""
    answers = {}
    for name, workload in (("main", MAIN), ("other", OTHER)):
        ran = chat(servers["stock"], workload, workload.requests(), {})
        assert ran["failed"] == 0
        answers[name] = ran["outputs"]
    return answers


def _stored_entries(redis_server: RedisProcess) -> int:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    try:
        return sum(1 for _ in client.scan_iter(match="visioncache:*/vllm-ec/*"))
    finally:
        client.close()


def _wait_for_entries(redis_server: RedisProcess, count: int, timeout: float = 30.0) -> None:
    """The writer is in the background: wait until the first replica's entries have landed."""
    deadline = time.monotonic() + timeout
    while _stored_entries(redis_server) < count:
        assert time.monotonic() < deadline, f"fewer than {count} entries reached Redis"
        time.sleep(0.1)


def test_a_replica_does_not_encode_what_another_encoded(
    replicas: tuple[VllmServer, VllmServer], redis_server: RedisProcess, stock_server: dict[str, list[Any]]
) -> None:
    first, second = replicas
    reference = stock_server["main"]
    before = first.encoded()
    ran_first = chat(first, MAIN, MAIN.requests(), {})
    assert ran_first["failed"] == 0
    assert first.encoded() - before == MAIN.distinct
    assert ran_first["outputs"] == reference  # tokens and top-5 logprobs, as the stock server
    _wait_for_entries(redis_server, MAIN.distinct)

    before = second.encoded()
    ran_second = chat(second, MAIN, MAIN.requests(), {})
    assert ran_second["failed"] == 0
    assert second.encoded() - before == 0
    assert ran_second["outputs"] == reference


def test_redis_killed_mid_workload_fails_no_request_and_changes_no_output(
    replicas: tuple[VllmServer, VllmServer], redis_server: RedisProcess, stock_server: dict[str, list[Any]]
) -> None:
    first, second = replicas
    reference = stock_server["other"]
    requests = OTHER.requests()
    half = len(requests) // 2
    replies: dict[tuple[int, int], str] = {}
    ran_first_half = chat(first, OTHER, requests[:half], replies)
    redis_server.stop()  # killed, as a crash would
    killed_at = time.monotonic()
    ran_second_half = chat(first, OTHER, requests[half:], replies)
    before = second.encoded()
    ran_second = chat(second, OTHER, requests, {})

    for ran in (ran_first_half, ran_second_half, ran_second):
        assert ran["failed"] == 0
    assert ran_first_half["outputs"] + ran_second_half["outputs"] == reference
    assert ran_second["outputs"] == reference
    # Nothing reachable any more: the second replica encodes every image itself.
    assert second.encoded() - before == OTHER.distinct
    # The breaker: at most one failed Redis call per retry interval (plus the first) per replica.
    # The first replica had everything it needed in vLLM's own cache after the kill; the second
    # asked Redis for every image. Connector stats reach /metrics with each engine step.
    deadline = time.monotonic() + 10
    while second.metric("vllm:visioncache_ec_tier_errors_total") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert second.metric("vllm:visioncache_ec_tier_errors_total") >= 1
    # Each replica has two chains (scheduler reads, worker writes), each behind its own breaker.
    elapsed = time.monotonic() - killed_at
    for server in replicas:
        assert server.metric("vllm:visioncache_ec_tier_errors_total") <= 2 * (1 + elapsed / RETRY_INTERVAL)
