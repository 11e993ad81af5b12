"""visioncache inside vllm-mlx 0.6.0's real OpenAI server (continuous batching, mlx-cpu), against
the stock server, through the real ``openai`` client on loopback.

Both servers record every vision-tower call and every emitted token with its top log-probs
(`tests.support.vllm_mlx_server`); the tests compare those records request by request.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_mlx.chat import (
    QUESTIONS,
    SYSTEM,
    Conversation,
    Reply,
    client_for,
    complete,
    image_url,
    question,
    turn_images,
    user_message,
)
from tests.support.vllm_mlx_server import ServerProcess

pytestmark = pytest.mark.slow


def engine_stats(server: ServerProcess) -> dict[str, Any]:
    stats: dict[str, Any] = server.get_json("/v1/cache/stats")["engine_cache"]["vision_embedding_cache"]
    return stats


class Recording:
    """The tower calls and tokens a server records from now on."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self._towers, self._tokens = len(server.records("tower")), len(server.records("token"))
        self.requests = len(server.records("request"))  # the request records before it began

    def towers(self) -> list[int]:
        return [entry["images"] for entry in self.server.records("tower")[self._towers :]]

    def tokens(self) -> list[dict[str, Any]]:
        return self.server.records("token")[self._tokens :]


def run_chats(
    server: ServerProcess, shared: str, own: list[str], logit_bias: dict[str, float] | None = None
) -> tuple[list[Reply], list[int]]:
    """The three-user, four-turn workload, one request at a time; replies and KV tokens reused."""
    client = client_for(server.base_url)
    conversations = [Conversation(logit_bias=logit_bias) for _ in own]
    replies, reused = [], []
    for turn in range(len(QUESTIONS)):
        for user, conversation in enumerate(conversations):
            before = engine_stats(server).get("kv_tokens_reused", 0)
            text = question(turn, user)
            replies.append(conversation.send(client, text, *turn_images(user, turn, shared, own)))
            reused.append(engine_stats(server).get("kv_tokens_reused", 0) - before)
    return replies, reused


def test_multi_turn_image_chats_encode_each_image_once_reuse_kv_and_match_stock(
    stock_server: ServerProcess, visioncache_server: ServerProcess
) -> None:
    shared, own = image_url(100), [image_url(101 + user) for user in range(3)]
    results = {}
    preprocessed = engine_stats(visioncache_server)["pixel_only_cache_computed"]
    for server in (stock_server, visioncache_server):
        recording = Recording(server)
        replies, reused = run_chats(server, shared, own)
        results[server.engine] = (replies, reused, recording.towers(), recording.tokens())
    # Each distinct image was decoded and preprocessed once too (a hit decodes nothing).
    assert engine_stats(visioncache_server)["pixel_only_cache_computed"] - preprocessed == 4
    stock_replies, _, stock_towers, stock_tokens = results["stock"]
    replies, reused, towers, tokens = results["visioncache"]

    # Greedy tokens and their top-5 log-probs are identical to the stock server's, bit for bit.
    assert replies == stock_replies
    assert len(tokens) == len(stock_tokens) > 0 and all("top" in entry for entry in tokens)
    assert tokens == stock_tokens
    # Stock runs the tower on every image of every request (the history re-sends them): 8 per user.
    assert sum(stock_towers) == 3 * (1 + 2 + 2 + 3)
    # visioncache encodes each of the 4 distinct images once.
    assert sum(towers) == 4
    # Every turn >= 2 reuses at least the whole previous turn of that user's KV.
    for index in range(3, len(replies)):
        assert reused[index] >= replies[index - 3].prompt_tokens, (index, reused, replies)
    stats = engine_stats(visioncache_server)
    assert stats["kv_tokens_reused"] >= sum(reused) > 0 and stats["vision_tower_calls"] >= 4
    # The same counters on vllm-mlx's Prometheus endpoint (--enable-metrics).
    metrics = scrape(visioncache_server)
    assert metrics["visioncache_vllm_mlx_vision_tower_calls_total", ""] == stats["vision_tower_calls"]
    assert metrics["visioncache_vllm_mlx_kv_tokens_reused_total", ""] == stats["kv_tokens_reused"]
    assert metrics["visioncache_cache_hits_total", "embedding"] == stats["embedding_cache_hits"] > 0


def scrape(server: ServerProcess) -> dict[tuple[str, str], float]:
    """``/metrics`` samples by (name, level label)."""
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(server.get_text("/metrics"))
    return {(s.name, s.labels.get("level", "")): s.value for family in families for s in family.samples}


def _in_one_step(server: ServerProcess, requests: list[list[dict[str, Any]]]) -> tuple[list[Any], list[Any]]:
    """Send ``requests`` concurrently, the engine held until all are queued (`ServerProcess.hold`),
    so that they reach ONE scheduler step by construction; the replies (or the client's errors)
    and the steps that took them (each the list of its requests' keys), as the engine recorded."""
    client = client_for(server.base_url)

    def send(messages: list[dict[str, Any]]) -> Any:
        try:
            return complete(client, messages, max_tokens=5)
        except Exception as error:  # the openai client's APIStatusError for a failed request
            return error

    steps = len(server.records("step"))
    with server.hold(len(requests)), ThreadPoolExecutor(len(requests)) as pool:
        replies = list(pool.map(send, requests))
    return replies, [entry["requests"] for entry in server.records("step")[steps:]]


def test_image_requests_of_one_step_share_one_tower_call(
    stock_server: ServerProcess, visioncache_server: ServerProcess
) -> None:
    cached, new = image_url(200), [image_url(seed) for seed in (201, 202, 203)]
    image_sets = [(new[0],), (new[1], cached), (new[0], new[2]), (cached,)]
    requests = [[user_message("describe the image", *images)] for images in image_sets]
    results = {}
    for server in (stock_server, visioncache_server):
        complete(client_for(server.base_url), [user_message("a", cached)], max_tokens=1)
        recording = Recording(server)
        replies, steps = _in_one_step(server, requests)
        # Both engines took the four requests in one step (what the assertions below are about).
        assert [len(step) for step in steps] == [len(requests)], steps
        results[server.engine] = (replies, recording.towers())
    stock_replies, stock_towers = results["stock"]
    replies, towers = results["visioncache"]
    assert all(isinstance(reply, Reply) for reply in replies) and replies == stock_replies
    assert sorted(stock_towers) == [1, 1, 2, 2]  # stock: one call per request, for all its images
    # visioncache: ONE call for the step's three distinct missing images.
    assert towers == [3]


def test_bad_inputs_fail_alone_with_the_engines_error(
    stock_server: ServerProcess, visioncache_server: ServerProcess, tmp_path: Path
) -> None:
    import base64

    corrupt = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"not a png" * 40).decode()
    bad_urls = [corrupt, (tmp_path / "missing.png").as_uri(), "data:image/png;base64," + "A" * (31 << 20)]
    good = [[user_message("describe the image", image_url(301))], [user_message("a", image_url(302))]]
    requests = [good[0], *([user_message("describe", url)] for url in bad_urls), good[1]]
    results = {}
    for server in (stock_server, visioncache_server):
        replies, steps = _in_one_step(server, requests)
        assert [len(step) for step in steps] == [len(requests)], steps  # the bad ones among the good
        results[server.engine] = replies
    for stock, ours in zip(results["stock"], results["visioncache"], strict=True):
        if isinstance(stock, Reply):
            assert ours == stock
        else:
            assert (ours.status_code, ours.body) == (stock.status_code, stock.body)
    assert [isinstance(reply, Reply) for reply in results["visioncache"]] == [True, False, False, False, True]
    # Each request alone still works afterwards (nothing was left half-prepared).
    assert (
        complete(client_for(visioncache_server.base_url), good[1], max_tokens=5) == results["visioncache"][-1]
    )


def test_restart_with_a_disk_tier_runs_the_tower_zero_times_for_seen_images(
    model_dir: Path, tmp_path: Path
) -> None:
    disk = ["--vision-cache-disk-dir", str(tmp_path / "tier")]
    images = [image_url(401), image_url(402)]
    requests = [[user_message("describe the image", images[0])], [user_message("compare", *images)]]
    runs = []
    for root in ("first", "restarted"):  # a fresh HOME each time: nothing but the tier carries over
        with ServerProcess("visioncache", model_dir, tmp_path / root, *disk) as server:
            recording = Recording(server)  # from now: the family's self-check at start is not counted
            client = client_for(server.base_url)
            replies = [complete(client, messages) for messages in requests]
            runs.append((replies, recording.towers(), engine_stats(server)))
    (first_replies, first_towers, _), (replies, towers, stats) = runs
    assert sum(first_towers) == 2
    assert towers == [] and stats["vision_tower_calls"] == 0 and stats["images_encoded"] == 0
    assert replies == first_replies


def test_another_image_or_position_reuses_only_the_text_before_it(
    stock_server: ServerProcess, visioncache_server: ServerProcess
) -> None:
    """Same text, another image of the same size (so the same token ids), or the same image one
    turn later: KV is reused up to the image at most, and the answers are stock's."""
    first, other = image_url(600, (112, 112)), image_url(601, (112, 112))
    system = {"role": "system", "content": SYSTEM}
    requests = [
        [system, user_message("describe the image", first)],
        [system, user_message("describe the image", other)],  # identical token ids, other pixels
        [system, user_message("a"), {"role": "assistant", "content": "a"}, user_message("describe", first)],
    ]
    results = {}
    for server in (stock_server, visioncache_server):
        client, replies, reused = client_for(server.base_url), [], []
        for messages in requests:
            before = engine_stats(server).get("kv_tokens_reused", 0)
            replies.append(complete(client, messages))
            reused.append(engine_stats(server).get("kv_tokens_reused", 0) - before)
        results[server.engine] = (replies, reused)
    replies, reused = results["visioncache"]
    assert replies == results["stock"][0]
    image_tokens = 16  # 112 x 112 pixels: 8 x 8 patches, merged 2 x 2
    # After the image: <|vision_end|> describe the image <|im_end|> <|im_start|> assistant.
    image_start = replies[0].prompt_tokens - image_tokens - 7
    assert replies[1].prompt_tokens == replies[0].prompt_tokens  # the same token ids, other pixels
    assert reused[1] <= image_start
    # After the image: <|vision_end|> describe <|im_end|> <|im_start|> assistant.
    assert reused[2] <= replies[2].prompt_tokens - image_tokens - 5


@pytest.mark.parametrize("given_as", ["a local directory", "a repository id"])
def test_regression_unsupported_family_given_as_a_repository_id_is_refused_at_start(
    tmp_path: Path, given_as: str
) -> None:
    """Regression (#18.7): with a repository id (and --vision-cache-model-id) the family was not
    checked: the server started, /health answered 200, and every request failed with 500, text-only
    ones too. A family visioncache does not serve is refused at start, whatever names the model."""
    from tests.support.mlx_model_dir import cache_as_repository

    model_dir = tmp_path / "florence2-tiny"  # a family without a description: refused from its config
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "florence2"}')
    root = tmp_path / "server"
    model = str(model_dir)
    if given_as == "a repository id":
        model = cache_as_repository(model_dir, root / "home", "tiny-org/florence2-tiny")
    server = ServerProcess("visioncache", model, root, "--vision-cache-model-id", "tiny-org/florence2-tiny@0")
    with pytest.raises(RuntimeError, match="server exited"):
        server.start()
    log = server.log_tail()
    assert "mlx-vlm model type 'florence2' is not supported" in log and "no family description" in log
    assert "Uvicorn running" not in log  # it never served: /health never answered
