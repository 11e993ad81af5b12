"""The families stock vllm-mlx 0.6.0 cannot serve (every image request fails): Gemma 3, LLaVA,
Mistral 3 and PaliGemma, served by visioncache serve-mlx in vllm-mlx's real OpenAI server through
the real ``openai`` client on loopback.

Stock has no answer to compare with, so the reference is mlx-vlm's own ``generate``, one request
at a time, on each request the server took (its templated prompt and images, recorded by the
server harness): `tests.support.mlx_oracle`. Each family's tiny random-weight checkpoint keeps
its real checkpoint's processing settings (`tests.support.mlx_families`). One stock server per
family records stock's failure; one visioncache server per family serves the workloads; both
count vision-tower calls on the model's tower class.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_mlx.chat import (
    QUESTIONS,
    Conversation,
    client_for,
    complete,
    image_url,
    question,
    user_message,
)
from tests.integrations.vllm_mlx.test_vllm_mlx_server import Recording, engine_stats
from tests.support.mlx_families import media_token_bias
from tests.support.mlx_model_dir import save_model_dir
from tests.support.mlx_oracle import Oracle
from tests.support.vllm_mlx_server import ServerProcess

pytestmark = pytest.mark.slow

FAMILIES = ["gemma3", "llava", "mistral3", "paligemma"]
# What stock vllm-mlx 0.6.0 + mlx-vlm 0.7.10 fails with on every image request (its log).
STOCK_ERRORS = {
    "gemma3": "expand_dims(): incompatible function arguments",  # no mask for the merge
    "paligemma": "expand_dims(): incompatible function arguments",
    "mistral3": "Model.__call__() missing 1 required positional argument: 'mask'",
    "llava": "unexpected keyword argument 'padding'",  # mlx-vlm's prepare_inputs, transformers 5
}
# PaliGemma on mlx-vlm takes one image per prompt, opening it; its prompts attend both ways, so
# no KV prefix is reused.
ONE_IMAGE = {"paligemma"}
# PaliGemma's language model (both-ways attention) builds no mask, so in vllm-mlx's batched decode
# a shorter prompt attends the left padding the batch gives it: its tokens after the first (its
# own prefill's) differ from its tokens alone, in stock vllm-mlx's text-only batches too.
BATCHED_DECODE_DIFFERS = {"paligemma"}
MAX_TOKENS = 6


@dataclass
class Served:
    family: str
    model_dir: Path
    stock: ServerProcess
    visioncache: ServerProcess
    oracle: Oracle

    def replay(
        self, recording: Recording, max_tokens: int = MAX_TOKENS
    ) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
        """(the server's tokens, mlx-vlm generate's) for every request the visioncache server
        took since ``recording`` began, in order (requests repeated in it share their tokens)."""
        requests = self.visioncache.records("request")[recording.requests :]
        tokens: dict[str, list[dict[str, Any]]] = {}
        for entry in recording.tokens():
            tokens.setdefault(entry["key"], []).append({"token": entry["token"], "top": entry.get("top")})
        bias = media_token_bias(self.model_dir)
        return [
            (
                tokens[request["key"]],
                self.oracle.tokens(request["prompt"], request["images"], max_tokens, bias),
            )
            for request in requests
        ]


@pytest.fixture(scope="module", params=FAMILIES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    family = request.param
    model_dir = save_model_dir(tmp_path_factory.mktemp(f"{family}-tiny"), family)
    started: list[ServerProcess] = []
    try:
        for engine in ("stock", "visioncache"):
            started.append(ServerProcess(engine, model_dir, tmp_path_factory.mktemp(engine)).start())
        yield Served(family, model_dir, *started, Oracle(str(model_dir)))
    finally:
        for server in started:
            server.stop()


def test_stock_vllm_mlx_fails_every_image_request_of_these_families(served: Served) -> None:
    """The premise: stock answers text, and fails a request with one image or two."""
    from openai import InternalServerError

    client = client_for(served.stock.base_url)
    assert complete(client, [user_message("describe the weather")], max_tokens=2).finish_reason
    for images in ([image_url(400)], [image_url(401), image_url(402)]):
        with pytest.raises(InternalServerError):
            complete(client, [user_message("describe the image", *images)], max_tokens=2)
    assert STOCK_ERRORS[served.family] in served.stock.log_tail(200_000)


def _turn_images(family: str, user: int, turn: int, shared: str, own: list[str]) -> tuple[str, ...]:
    """The three-user workload's images (chat.turn_images); for one-image families, each user's
    chat holds one image (the shared one for users 0 and 2), sent at turn 1."""
    if family in ONE_IMAGE:
        return ((shared if user != 1 else own[user]),) if turn == 0 else ()
    return ((shared,), (own[user],), (), (own[(user + 1) % len(own)],))[turn]


def test_multi_turn_image_chats_match_mlx_vlm_generate_and_encode_each_image_once(served: Served) -> None:
    """Three users, four turns each, history re-sent, one request at a time: every request's
    greedy tokens and their top-5 log-probs are mlx-vlm generate's, bit for bit; each distinct
    image goes through the tower once; turn >= 2 reuses the previous turn's KV (not PaliGemma)."""
    server, bias = served.visioncache, media_token_bias(served.model_dir)
    shared, own = image_url(100), [image_url(101 + user) for user in range(3)]
    recording = Recording(server)
    client = client_for(server.base_url)
    conversations = [Conversation(logit_bias=bias) for _ in own]
    replies, reused, sent = [], [], set()
    for turn in range(len(QUESTIONS)):
        for user, conversation in enumerate(conversations):
            before = engine_stats(server).get("kv_tokens_reused", 0)
            images = _turn_images(served.family, user, turn, shared, own)
            sent.update(images)
            replies.append(conversation.send(client, question(turn, user), *images, max_tokens=MAX_TOKENS))
            reused.append(engine_stats(server).get("kv_tokens_reused", 0) - before)
    replayed = served.replay(recording)
    assert len(replayed) == len(replies) == 12
    for index, (tokens, expected) in enumerate(replayed):
        assert tokens and all(entry["top"] for entry in tokens), index
        assert tokens == expected, (index, replies[index])
    assert recording.towers() and sum(recording.towers()) == len(sent)  # each distinct image once
    assert engine_stats(server)["image_request_errors"] == 0
    if served.family in ONE_IMAGE:
        assert sum(reused) == 0 and engine_stats(server)["kv_prefix_hits"] == 0
        return
    for index in range(3, len(replies)):
        assert reused[index] >= replies[index - 3].prompt_tokens, (index, reused, replies)


def test_image_requests_of_one_step_share_one_tower_call(served: Served) -> None:
    """Four requests in one scheduler step: the three distinct missing images in ONE tower call
    (two for PaliGemma's one-image requests); each request's tokens and their top log-probs are
    mlx-vlm generate's for it alone, the batched decode included (PaliGemma: its first token,
    see BATCHED_DECODE_DIFFERS)."""
    server = served.visioncache
    cached, new = image_url(200), [image_url(seed) for seed in (201, 202, 203)]
    image_sets = [(new[0],), (new[1], cached), (new[0], new[2]), (cached,)]
    if served.family in ONE_IMAGE:
        image_sets = [(new[0],), (new[1],), (new[0],), (cached,)]
    client = client_for(server.base_url)
    complete(client, [user_message("a", cached)], max_tokens=1)
    recording, steps = Recording(server), len(server.records("step"))
    requests = [[user_message(QUESTIONS[index], *images)] for index, images in enumerate(image_sets)]

    def send(messages: list[dict[str, Any]]) -> Any:
        return complete(client, messages, max_tokens=3, logit_bias=media_token_bias(served.model_dir))

    with server.hold(len(requests)), ThreadPoolExecutor(len(requests)) as pool:
        list(pool.map(send, requests))
    taken = [entry["requests"] for entry in server.records("step")[steps:]]
    assert [len(step) for step in taken] == [len(requests)], taken  # one step took all four
    missing = {image for images in image_sets for image in images} - {cached}
    assert recording.towers() == [len(missing)]
    replayed = served.replay(recording, max_tokens=3)
    assert len(replayed) == len(requests)
    for tokens, expected in replayed:
        if served.family in BATCHED_DECODE_DIFFERS:
            tokens, expected = tokens[:1], expected[:1]
        assert tokens == expected
    assert engine_stats(server)["image_request_errors"] == 0
