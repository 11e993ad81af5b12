"""Video handles in serve-mlx (`visioncache.integrations.vllm_mlx.video_handles`), on the real
server, through the real ``openai`` client: upload a video once, then send only
``{"type": "video_url", "video_url": {"url": "visioncache://..."}}``.

Compared with stock vllm-mlx receiving the video inline on every turn (tokens and top-5 log-probs
as both servers record them, tower calls counted on the model), with every request body measured
on the client's side. A video handle is resolved into vllm-mlx's own video path (the kept bytes
as the data URL the client would have sent), so the engine's work is stock's, turn for turn.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_mlx.chat import SYSTEM, image_png
from tests.integrations.vllm_mlx.test_vllm_mlx_handles import (
    QUESTIONS,
    BodyLog,
    Reads,
    handle_of,
    no_placeholders,
    post,
    servers,
    tokens_of,
)
from tests.integrations.vllm_mlx.test_vllm_mlx_server import Recording, engine_stats
from tests.support.vllm_mlx_server import ServerProcess

pytestmark = pytest.mark.slow

__all__ = ["servers"]  # the shared stock and visioncache servers (salted: tenant-a)

VIDEOS = "/v1/visioncache/videos"


def video_mp4(tmp_path: Path, seed: int, frames: int = 6) -> bytes:
    """A tiny random MP4 (OpenCV's mp4v, 4 fps, 64 x 48), distinct per seed."""
    import cv2
    import numpy as np

    path = tmp_path / f"clip-{seed}.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 4, (64, 48))
    rng = np.random.default_rng(seed)
    for _ in range(frames):
        writer.write(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    writer.release()
    return path.read_bytes()


def inline_video(video: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(video).decode()


def upload_video(server: ServerProcess, video: bytes) -> Any:
    return post(server.base_url + VIDEOS, data=video, headers={"content-type": "video/mp4"})


def video_message(text: str, url: str | None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [] if url is None else [{"type": "video_url", "video_url": {"url": url}}]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def video_chat(client: Any, url: str, bias: dict[str, float]) -> list[tuple[str, int]]:
    """Ten turns about one video: the video in the first user message, the history re-sent."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    replies = []
    for turn, question in enumerate(QUESTIONS):
        messages.append(video_message(question, url if turn == 0 else None))
        response = client.chat.completions.create(
            model="model", messages=messages, max_tokens=5, temperature=0.0, logit_bias=bias
        )
        text = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        replies.append((text, response.usage.prompt_tokens))
    return replies


def ask_video(server: ServerProcess, url: str) -> Any:
    """One request with one video: ``(reply text, prompt tokens)`` or ``(status, error body)``."""
    from openai import APIStatusError

    from tests.integrations.vllm_mlx.chat import client_for

    try:
        response = client_for(server.base_url).chat.completions.create(
            model="model", messages=[video_message("describe the video", url)], max_tokens=4, temperature=0.0
        )
    except APIStatusError as error:
        return error.status_code, error.body
    return response.choices[0].message.content, response.usage.prompt_tokens


def test_a_ten_turn_video_chat_sending_only_the_handle_answers_as_stock_resending_the_video(
    servers: list[ServerProcess], model_dir: Path, tmp_path: Path
) -> None:
    stock, ours = servers
    video = video_mp4(tmp_path, 900)
    stock_log, our_log = BodyLog(), BodyLog()
    bias = no_placeholders(model_dir)
    stock_recording = Recording(stock)
    stock_replies = video_chat(stock_log.openai(stock), inline_video(video), bias)

    response = upload_video(ours, video)
    assert response.status_code == 200, response.text
    (uploaded,) = response.json()["data"]
    assert uploaded["object"] == "visioncache.video" and uploaded["bytes"] == len(video)
    assert uploaded["kept"] is True and uploaded["encoded"] is False and "reason" not in uploaded
    our_recording = Recording(ours)
    replies = video_chat(our_log.openai(ours), uploaded["handle"], bias)

    assert replies == stock_replies
    assert tokens_of(our_recording) == tokens_of(stock_recording) and all(
        top is not None for _, top in tokens_of(our_recording)
    )
    # The engine's work is stock's, turn for turn: vllm-mlx 0.6.0 samples the video's frames and
    # encodes them on every request (it caches no video features), and so does serve-mlx's.
    assert our_recording.towers() == stock_recording.towers() and sum(stock_recording.towers()) > 0
    # ... and no token reads them: its chat templating leaves a video_url part out of the prompt.
    prompts = [entry["prompt"] for entry in stock.records("request")[stock_recording.requests :]]
    assert len(prompts) == len(QUESTIONS) and not any("_pad|>" in prompt for prompt in prompts)
    # Measured: stock's every turn carries the video; ours carries none (the upload did).
    payload = base64.b64encode(video)
    assert len(stock_log.bodies) == len(our_log.bodies) == len(QUESTIONS)
    assert all(payload in body for body in stock_log.bodies)
    assert not any(payload in body or video in body for body in our_log.bodies)
    assert max(map(len, our_log.bodies)) < len(video) < min(map(len, stock_log.bodies))
    assert engine_stats(ours)["handles_resolved"] >= len(QUESTIONS)


def test_a_video_handle_is_read_and_verified_once_per_request(
    servers: list[ServerProcess], tmp_path: Path
) -> None:
    _, ours = servers
    video = video_mp4(tmp_path, 901)
    reads = Reads(ours)
    handle = upload_video(ours, video).json()["data"][0]["handle"]
    assert reads.hashed() == [len(video)]  # an upload hashes the video once
    reads = Reads(ours)
    inline_answer = ask_video(ours, inline_video(video))
    assert len(video) not in reads.hashed()  # vllm-mlx's own path hashes its sampled frames only
    reads = Reads(ours)
    assert ask_video(ours, handle) == inline_answer
    # The kept bytes read from memory (no tier here) and verified once against the handle's digest.
    assert [size for size in reads.hashed() if size >= len(video)] == [len(video)]
    assert reads.tier_bytes() == 0 and reads.opened() == 1


def half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def bad_video_forms(video: bytes) -> dict[str, Callable[[str], Any]]:
    """Every way to upload ``video``, raw and JSON (raw base64 and a data URL), by name."""
    encoded = base64.b64encode(video).decode()
    return {
        "raw": lambda url: post(url, data=video, headers={"content-type": "video/mp4"}),
        "JSON": lambda url: post(url, json={"video": encoded}),
        "JSON data URL": lambda url: post(url, json={"videos": ["data:video/mp4;base64," + encoded]}),
    }


@pytest.mark.parametrize(
    ("what", "make"),
    [
        ("half an MP4 (its index cut off)", lambda path: half(video_mp4(path, 902))),
        ("random bytes", lambda path: bytes(range(256)) * 8),
        ("an empty body", lambda path: b""),
    ],
)
def test_bad_video_uploads_are_a_4xx_with_a_json_error_whatever_the_form(
    servers: list[ServerProcess], tmp_path: Path, what: str, make: Callable[[Path], bytes]
) -> None:
    _, ours = servers
    issued = engine_stats(ours)["handles_issued"]
    for form, send in bad_video_forms(make(tmp_path)).items():
        response = send(ours.base_url + VIDEOS)
        assert response.status_code == 400, (what, form, response.status_code, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_video" and error["type"] == "invalid_request_error", (what, form)
    for body in ({"video": "not base64!"}, {"videos": []}, {"image": "AAAA"}, {"video": 3}):
        response = post(ours.base_url + VIDEOS, json=body)
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_video", body
    assert engine_stats(ours)["handles_issued"] == issued  # nothing issued, nothing kept


def test_video_handles_refuse_forgeries_the_other_kind_and_forgotten_videos(
    servers: list[ServerProcess], tmp_path: Path
) -> None:
    _, ours = servers
    video = video_mp4(tmp_path, 903)
    handle = upload_video(ours, video).json()["data"][0]["handle"]
    image_handle = handle_of(ours, image_png(904))
    forged = "visioncache://" + "A" * 64
    assert ask_video(ours, forged)[0] == 404
    assert ask_video(ours, "visioncache://short")[0] == 400
    status, body = ask_video(ours, image_handle)  # an image's handle where a video goes
    assert status == 400 and body["code"] == "wrong_handle_kind", body
    from tests.integrations.vllm_mlx.test_vllm_mlx_handles import ask

    status, body = ask(ours, handle)  # a video's handle where an image goes
    assert status == 400 and body["code"] == "wrong_handle_kind", body
    assert ask_video(ours, handle)[0] not in (400, 404, 410)
    deleted = __import__("requests").delete(ours.base_url + VIDEOS + "/" + handle, timeout=60)
    assert deleted.status_code == 200 and deleted.json()["kept_bytes"] == 1, deleted.text
    status, body = ask_video(ours, handle)
    assert status == 410 and body["code"] == "image_handle_expired", body


def test_a_video_too_large_to_keep_without_a_tier_is_answered_as_not_kept(
    model_dir: Path, tmp_path: Path
) -> None:
    small, large = video_mp4(tmp_path, 905, frames=2), video_mp4(tmp_path, 906, frames=12)
    assert len(small) < len(large)
    budget = str(len(small) + 100)
    flags = ["--vision-cache-max-handle-bytes", budget]
    with ServerProcess("visioncache", model_dir, tmp_path, *flags) as server:
        answers = [upload_video(server, video).json()["data"][0] for video in (small, large)]
        assert answers[0]["kept"] is True and "reason" not in answers[0]
        assert answers[1]["kept"] is False and "--vision-cache-max-handle-bytes" in answers[1]["reason"]
        assert ask_video(server, answers[0]["handle"])[0] not in (400, 404, 410)
        status, body = ask_video(server, answers[1]["handle"])
        assert status == 410 and body["code"] == "image_handle_expired", body
