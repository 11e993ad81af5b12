"""An image whose KV a prefix hit reuses is not tower-encoded (the real server, the ``openai``
client, tower calls counted on the model itself, tokens and top log-probs against stock's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integrations.vllm_mlx.chat import Conversation, client_for, image_url
from tests.integrations.vllm_mlx.test_vllm_mlx_server import Recording, engine_stats, scrape
from tests.support.vllm_mlx_server import ServerProcess

pytestmark = pytest.mark.slow

QUESTIONS = ("describe the image", "compare it with this one", "and with this one")


@pytest.fixture(scope="module")
def one_entry_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A visioncache server whose memory holds the features of one image only: the history's
    other images are gone from it by the next turn."""
    flags = (
        "--vision-cache-max-embedding-entries",
        "1",
        "--vision-cache-max-pixel-entries",
        "1",
        "--enable-metrics",
    )
    with ServerProcess("visioncache", model_dir, tmp_path_factory.mktemp("one-entry"), *flags) as server:
        yield server


def test_regression_an_image_whose_kv_is_reused_is_not_tower_encoded_again(
    stock_server: ServerProcess, one_entry_server: ServerProcess
) -> None:
    """A 3-turn chat, one new image a turn, the history re-sent: turn 3's first image had been
    evicted from the features cache, and serve-mlx encoded it again although the KV it reused
    already held it (issue #32: after a restart, every image of a running chat was re-encoded)."""
    images = [image_url(700 + turn) for turn in range(len(QUESTIONS))]
    results = {}
    for server in (stock_server, one_entry_server):
        recording, chat, client = Recording(server), Conversation(), client_for(server.base_url)
        towers = []
        for text, image in zip(QUESTIONS, images, strict=True):
            before = len(recording.towers())
            chat.send(client, text, image)
            towers.append(sum(recording.towers()[before:]))
        results[server.engine] = (chat.messages, towers, recording.tokens())
    stock_messages, stock_towers, stock_tokens = results["stock"]
    messages, towers, tokens = results["visioncache"]

    assert messages == stock_messages
    assert len(tokens) == len(stock_tokens) > 0 and all("top" in entry for entry in tokens)
    assert tokens == stock_tokens  # greedy tokens and top-5 log-probs, bit for bit
    assert stock_towers == [1, 2, 3]  # stock encodes the whole history every turn
    stats = engine_stats(one_entry_server)
    assert towers == [1, 1, 1], stats  # only each turn's new image: the reused KV covers the others
    assert stats["kv_covered_images_not_encoded"] == 1 + 2  # turn 2: image 1; turn 3: images 1, 2
    assert stats["kv_covered_images_encoded_late"] == 0
    assert stats["kv_prefix_hits"] == 2 and stats["images_encoded"] == 3
    metrics = scrape(one_entry_server)
    assert metrics["visioncache_vllm_mlx_kv_covered_images_not_encoded_total", ""] == 3
