"""Image-aware KV reuse with ``--chunked-prefill-tokens`` (issue #32), against the stock server with
the same flag: the real server on mlx-cpu, the ``openai`` client, tower calls and prefill positions
counted on the model itself (`tests.support.vllm_mlx_server`).

Stock vllm-mlx 0.6.0 interleaves text-only prompts in chunks of N tokens and prefills an image
prompt in one forward, flag or not; its prefix cache stores each finished request's prompt KV,
cut back to the prompt's end. So the cold path of an image prompt is one chunk, ending where the
snapshot is taken, and turn k+1 reuses turn k's whole prompt and prefills exactly the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_mlx.chat import Conversation, client_for, image_url
from tests.integrations.vllm_mlx.test_vllm_mlx_server import Recording, engine_stats
from tests.support.mlx_families import media_token_bias
from tests.support.mlx_model_dir import save_model_dir
from tests.support.vllm_mlx_server import ServerProcess

pytestmark = pytest.mark.slow

CHUNK = "64"  # shorter than every prompt here (the system prompt alone is 128+ tokens)
FLAGS = ("--chunked-prefill-tokens", CHUNK)


def _servers(model_dir: Path, root: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    started: list[ServerProcess] = []
    try:
        for engine in ("stock", "visioncache"):
            started.append(ServerProcess(engine, model_dir, root / engine, *FLAGS).start())
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def chunked_servers(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Stock and visioncache servers of the tiny Qwen2-VL, both with ``--chunked-prefill-tokens``."""
    yield from _servers(model_dir, tmp_path_factory.mktemp("chunked"))


def prefilled(server: ServerProcess, since: int) -> int:
    """Prompt positions the decoder computed after the first ``since`` forward records: every
    forward of one row over more than one token (a decode step computes one token a row)."""
    forwards = server.records("forward")[since:]
    return sum(entry["tokens"] for entry in forwards if entry["rows"] == 1 and entry["tokens"] > 1)


def chat(
    server: ServerProcess, turns: list[tuple[str, str]], bias: dict[str, float] | None = None
) -> dict[str, Any]:
    """One chat, one request at a time, the history re-sent; per turn: prompt tokens, prompt
    positions computed, KV tokens reused and images through the tower."""
    recording, conversation = Recording(server), Conversation(logit_bias=bias)
    client = client_for(server.base_url)
    turn_stats: dict[str, list[int]] = {"prompt": [], "prefilled": [], "reused": [], "towers": []}
    for text, image in turns:
        forwards, towers = len(server.records("forward")), len(recording.towers())
        before = engine_stats(server).get("kv_tokens_reused", 0)
        reply = conversation.send(client, text, *([image] if image else []))
        turn_stats["prompt"].append(reply.prompt_tokens)
        turn_stats["prefilled"].append(prefilled(server, forwards))
        turn_stats["reused"].append(engine_stats(server).get("kv_tokens_reused", 0) - before)
        turn_stats["towers"].append(sum(recording.towers()[towers:]))
    return {"messages": conversation.messages, "tokens": recording.tokens(), **turn_stats}


def test_with_chunked_prefill_turn_k_plus_1_reuses_turn_k_kv_prefills_only_the_tail_and_matches_stock(
    chunked_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """Issue #32: with --chunked-prefill-tokens, serve-mlx reused no KV for image prompts and
    prefilled the whole history every turn."""
    stock_server, server = chunked_servers
    first, second = image_url(910), image_url(911)
    # Turn 3 sends the first image again, at a new position: its features are cached, its KV is not.
    turns = [("describe the image", first), ("compare it with this one", second), ("and this one", first)]
    stock, ours = chat(stock_server, turns), chat(server, turns)

    # Greedy tokens and their top-5 log-probs are stock's (same flags), bit for bit.
    assert ours["messages"] == stock["messages"]
    assert len(ours["tokens"]) == len(stock["tokens"]) > 0 and all("top" in entry for entry in ours["tokens"])
    assert ours["tokens"] == stock["tokens"]
    prompts = ours["prompt"]
    assert prompts == stock["prompt"] and min(prompts) > 2 * int(CHUNK)
    # Stock prefills the whole history every turn, in one forward each (it never chunks an image
    # prompt), and runs the tower on every image of it.
    assert stock["prefilled"] == prompts and stock["reused"] == [0, 0, 0]
    assert stock["towers"] == [1, 2, 3]
    # serve-mlx: turn k+1 reuses exactly turn k's prompt (its KV stored at the prompt's end, where
    # the cold path's one chunk ends) and prefills exactly the rest: the reply and the new message.
    assert ours["reused"] == [0, prompts[0], prompts[1]]
    assert ours["prefilled"] == [prompts[0], prompts[1] - prompts[0], prompts[2] - prompts[1]]
    # Each distinct image through the tower once: turn 2's first image lies in the reused KV,
    # turn 3's images are in the reused KV or the features cache.
    assert ours["towers"] == [1, 1, 0]
    stats = engine_stats(server)
    assert stats["kv_prefix_hits"] == 2 and stats["kv_prefix_refused"] == 0
    assert stats["kv_reuse_refused"] is None and stats["images_encoded"] == 2


@pytest.fixture(scope="module")
def hybrid_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3.5 (gated-delta layers beside attention)."""
    return save_model_dir(tmp_path_factory.mktemp("qwen3_5-tiny"), "qwen3_5")


@pytest.fixture(scope="module")
def hybrid_servers(
    hybrid_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Stock and visioncache servers of the tiny Qwen3.5, both with ``--chunked-prefill-tokens``."""
    yield from _servers(hybrid_model, tmp_path_factory.mktemp("hybrid-chunked"))


def test_a_family_whose_split_prefill_is_not_exact_is_refused_kv_reuse_with_the_reason_under_chunked_prefill(
    hybrid_model: Path, hybrid_servers: tuple[ServerProcess, ServerProcess]
) -> None:
    """Qwen3.5's recurrent state prefilled as a cached prefix plus a tail gives other logits on
    this CPU than one prefill (the self-check's probe): reusing it would change the answer, so
    its image prompts are prefilled whole, as stock prefills them; the log and the stats say why."""
    stock_server, server = hybrid_servers
    bias = media_token_bias(hybrid_model)
    turns = [("describe the image", image_url(920)), ("compare it with this one", image_url(921))]
    stock, ours = chat(stock_server, turns, bias), chat(server, turns, bias)

    assert ours["messages"] == stock["messages"] and ours["tokens"] == stock["tokens"]
    assert ours["prompt"] == stock["prompt"] and ours["reused"] == [0, 0]  # turn 2: the whole history
    assert ours["towers"] == [1, 1] and stock["towers"] == [1, 2]  # per-image features are kept
    stats = engine_stats(server)
    reason = stats["kv_reuse_refused"]
    assert "qwen3_5" in reason and "self-check" in reason, stats
    assert stats["kv_prefix_hits"] == 0 and stats["kv_tokens_reused"] == 0
    assert f"KV reuse is off for image prompts: {reason}" in server.log_tail(10_000_000)
