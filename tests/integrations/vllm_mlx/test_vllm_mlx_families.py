"""Every family visioncache serves in vllm-mlx 0.6.0's real server, against the stock server, through
the real ``openai`` client on loopback (Qwen2-VL has its own module, test_vllm_mlx_server.py).

For each family, on its tiny random-weight checkpoint, one stock and one visioncache server are
started and shared by the module's tests; both record every vision-tower call (on the model's
tower class; for Idefics3 / SmolVLM the unit is an image tile) and every emitted token with its
top log-probs (`tests.support.vllm_mlx_server`).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_mlx.chat import client_for, complete, image_url, user_message
from tests.integrations.vllm_mlx.test_vllm_mlx_server import Recording, engine_stats, run_chats
from tests.support.mlx_families import media_token_bias
from tests.support.mlx_model_dir import save_model_dir
from tests.support.mlx_towers import tower_units
from tests.support.vllm_mlx_server import ServerProcess

pytestmark = pytest.mark.slow

FAMILIES = ["qwen2_5_vl", "qwen3_vl", "qwen3_5", "idefics3", "smolvlm", "gemma4"]
# Qwen3.5's gated-delta layers give other numbers when a prompt is prefilled in two parts (the
# family self-check's split-prefill probe), so serve-mlx reuses no KV for its image prompts.
NO_KV_REUSE = {"qwen3_5"}


@dataclass
class Servers:
    family: str
    model_dir: Path
    stock: ServerProcess
    visioncache: ServerProcess

    def units(self, *images: str) -> int:
        """What encoding ``images`` once each costs the tower (images, or tiles)."""
        return tower_units(self.model_dir, list(images))


@pytest.fixture(scope="module", params=FAMILIES)
def servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    family = request.param
    model_dir = save_model_dir(tmp_path_factory.mktemp(f"{family}-tiny"), family)
    started: list[ServerProcess] = []
    try:
        for engine in ("stock", "visioncache"):
            started.append(ServerProcess(engine, model_dir, tmp_path_factory.mktemp(engine)).start())
        yield Servers(family, model_dir, *started)
    finally:
        for server in started:
            server.stop()


def test_multi_turn_image_chats_encode_each_image_once_reuse_kv_and_match_stock(servers: Servers) -> None:
    """Three users, four turns, history re-sent: a shared image, each user's own, a text-only turn,
    and another user's image."""
    shared, own = image_url(100), [image_url(101 + user) for user in range(3)]
    results = {}
    for server in (servers.stock, servers.visioncache):
        recording = Recording(server)
        replies, reused = run_chats(server, shared, own, media_token_bias(servers.model_dir))
        results[server.engine] = (replies, reused, recording.towers(), recording.tokens())
    stock_replies, _, stock_towers, stock_tokens = results["stock"]
    replies, reused, towers, tokens = results["visioncache"]
    # Greedy tokens and their top-5 log-probs are identical to the stock server's, bit for bit.
    assert replies == stock_replies
    assert len(tokens) == len(stock_tokens) > 0 and all("top" in entry for entry in tokens)
    assert tokens == stock_tokens
    # Stock runs the tower on every image of every request (the history re-sends them) ...
    assert sum(stock_towers) == sum(
        servers.units(*images) for user in range(3) for images in _turns(shared, own, user)
    )
    # ... visioncache encodes each of the 4 distinct images once, for the whole run.
    assert sum(towers) == servers.units(shared, *own)
    if servers.family in NO_KV_REUSE:
        assert sum(reused) == 0 and engine_stats(servers.visioncache)["kv_prefix_hits"] == 0
        return
    # Every turn >= 2 reuses at least the whole previous turn of that user's KV.
    for index in range(3, len(replies)):
        assert reused[index] >= replies[index - 3].prompt_tokens, (index, reused, replies)


def _turns(shared: str, own: list[str], user: int) -> list[list[str]]:
    """The images each of ``user``'s four requests carries (history included)."""
    return [[shared], [shared, own[user]], [shared, own[user]], [shared, own[user], own[(user + 1) % 3]]]


def test_image_requests_of_one_step_share_one_tower_call(servers: Servers) -> None:
    cached, new = image_url(200), [image_url(seed) for seed in (201, 202, 203)]
    image_sets = [(new[0],), (new[1], cached), (new[0], new[2]), (cached,)]
    requests = [[user_message("describe the image", *images)] for images in image_sets]
    results = {}
    for server in (servers.stock, servers.visioncache):
        client = client_for(server.base_url)
        complete(client, [user_message("a", cached)], max_tokens=1)
        recording = Recording(server)
        steps = len(server.records("step"))

        def send(messages: list[dict[str, Any]], client: Any = client) -> Any:
            return complete(client, messages, max_tokens=5)

        with server.hold(len(requests)), ThreadPoolExecutor(len(requests)) as pool:
            replies = list(pool.map(send, requests))
        taken = [entry["requests"] for entry in server.records("step")[steps:]]
        assert [len(step) for step in taken] == [len(requests)], taken  # one step took all four
        results[server.engine] = (replies, recording.towers())
    stock_replies, stock_towers = results["stock"]
    replies, towers = results["visioncache"]
    assert replies == stock_replies
    assert sorted(stock_towers) == sorted(servers.units(*images) for images in image_sets)
    # visioncache: ONE call for the step's three distinct missing images.
    assert towers == [servers.units(*new)]
    assert engine_stats(servers.visioncache)["image_request_errors"] == 0


# Families whose prepare_inputs returns model inputs besides pixels and grids (Gemma 4's
# mm_token_type_ids): stock vllm-mlx stores them in its pixel cache by reference and clears them
# after the first request's prefill, so it answers an identical request without them.
STOCK_REPLAYS_WITHOUT_EXTRAS = {"gemma4"}


def test_a_repeated_request_is_answered_as_the_first_one(servers: Servers) -> None:
    """The same image request twice: visioncache answers it the same both times (its first answer
    is stock's first); stock answers the repeat from its pixel cache, which for Gemma 4 has lost
    the image token types, so its image tokens no longer attend each other both ways."""
    messages = [user_message("tell me about the photo please", image_url(300))]
    answers = {}
    for server in (servers.stock, servers.visioncache):
        sent = []
        for _ in range(2):
            recording = Recording(server)
            complete(client_for(server.base_url), messages, 3, media_token_bias(servers.model_dir))
            sent.append(recording.tokens())
        answers[server.engine] = sent
    (stock_first, stock_repeat), (first, repeat) = answers["stock"], answers["visioncache"]
    assert first == repeat == stock_first
    assert (stock_repeat != stock_first) is (servers.family in STOCK_REPLAYS_WITHOUT_EXTRAS)


def _video_url(tmp_path: Path, frames: int = 8) -> str:
    """A tiny random MP4 (OpenCV's mp4v, 4 fps) as a data URL."""
    import base64

    import cv2
    import numpy as np

    path = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 4, (64, 48))
    rng = np.random.default_rng(0)
    for _ in range(frames):
        writer.write(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    writer.release()
    return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()


def test_a_gemma4_video_reaches_no_model_through_vllm_mlx_0_6_0(servers: Servers, tmp_path: Path) -> None:
    """Why serve-mlx does not serve Gemma 4 video: vllm-mlx 0.6.0's batched MLLM engine samples a
    video's frames (OpenCV) and hands them to mlx-vlm's prepare_inputs as images, while its chat
    templating leaves the ``video_url`` part out of the prompt (it converts image and audio parts
    only), so the frames are encoded and no token reads them: a request with a video is answered
    as the same request without it, by stock vllm-mlx and by serve-mlx alike (video requests keep
    vllm-mlx's own path). mlx-vlm 0.7.10 does encode Gemma 4 video (``pixel_values_videos``), on
    a path vllm-mlx never calls."""
    if servers.family != "gemma4":
        pytest.skip("Gemma 4's video")
    video = {"type": "video_url", "video_url": {"url": _video_url(tmp_path)}}
    text = {"type": "text", "text": "describe the video"}
    for server in (servers.stock, servers.visioncache):
        client = client_for(server.base_url)
        recording = Recording(server)
        with_video = complete(client, [{"role": "user", "content": [video, text]}], 4)
        towers = recording.towers()
        without = complete(client, [{"role": "user", "content": [text]}], 4)
        assert with_video == without, server.engine  # same prompt tokens, same answer
        assert towers and sum(towers) > 0, server.engine  # its frames went through the tower, unread
