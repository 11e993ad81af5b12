"""Image handles in serve-mlx (`visioncache.integrations.handles`), on the real server,
through the real ``openai`` client: upload once, then send only ``visioncache://<handle>``.

Compared with stock vllm-mlx receiving the image on every turn (tokens and top-5 log-probs as both
servers record them), with every request body measured on the client's side.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_mlx.chat import SYSTEM, client_for, image_png, user_message
from tests.integrations.vllm_mlx.test_vllm_mlx_server import Recording, engine_stats
from tests.support.vllm_mlx_server import ServerProcess
from tests.tiers.conftest import RedisProcess, redis_process_factory, redis_server

pytestmark = pytest.mark.slow

__all__ = ["redis_process_factory", "redis_server"]  # the fixtures this module uses

SALT_FLAG = "--vision-cache-salt"
QUESTIONS = [
    "describe the image",
    "what colour is it",
    "and the corners",
    "is there text",
    "count the shapes",
    "what is on the left",
    "and on the right",
    "is it a photo",
    "what is missing",
    "summarise",
]


class BodyLog:
    """The ``openai`` client's own HTTP client, keeping every request body it sends (what crossed
    the network)."""

    def __init__(self) -> None:
        from openai import DefaultHttpxClient

        self.bodies: list[bytes] = []
        self.client = DefaultHttpxClient(event_hooks={"request": [self._keep]}, timeout=120)

    def _keep(self, request: Any) -> None:
        self.bodies.append(request.read())

    def openai(self, server: ServerProcess) -> Any:
        from openai import OpenAI

        url = server.base_url + "/v1"
        return OpenAI(base_url=url, api_key="unused", max_retries=0, http_client=self.client)


class Reads:
    """What the visioncache server reads from now on (`tests.support.vllm_mlx_server._count_reads`):
    the bytes given to its content hasher (per call), the bytes its tiers return, the handles
    it opens."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self._start = {kind: len(server.records(kind)) for kind in ("hashed", "tier_read", "opened")}

    def _since(self, kind: str) -> list[dict[str, Any]]:
        return self.server.records(kind)[self._start[kind] :]

    def hashed(self) -> list[int]:
        return [entry["bytes"] for entry in self._since("hashed")]

    def tier_bytes(self) -> int:
        return sum(entry["bytes"] for entry in self._since("tier_read"))

    def opened(self) -> int:
        return len(self._since("opened"))


def post(url: str, **options: Any) -> Any:
    import requests

    return requests.post(url, timeout=120, **options)


def upload(server: ServerProcess, *images: bytes, **options: Any) -> Any:
    """``POST /v1/visioncache/images``: one image as the raw body, several (or options) as JSON."""
    url = server.base_url + "/v1/visioncache/images"
    if len(images) == 1 and not options:
        return post(url, data=images[0], headers={"content-type": "image/png"})
    return post(url, json={"images": [base64.b64encode(image).decode() for image in images], **options})


def handle_of(server: ServerProcess, image: bytes) -> str:
    response = upload(server, image)
    assert response.status_code == 200, response.text
    handle: str = response.json()["data"][0]["handle"]
    return handle


def ask(server: ServerProcess, image_url: str, text: str = "describe the image") -> Any:
    """One request with one image: ``(reply text, prompt tokens)`` or ``(status, error body)``."""
    from openai import APIStatusError

    client = client_for(server.base_url)
    try:
        response = client.chat.completions.create(
            model="model", messages=[user_message(text, image_url)], max_tokens=5, temperature=0.0
        )
    except APIStatusError as error:
        return error.status_code, error.body
    return response.choices[0].message.content, response.usage.prompt_tokens


def inline(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def tokens_of(recording: Recording) -> list[tuple[Any, Any]]:
    """The emitted tokens and top log-probs in order (request keys differ: handle vs image)."""
    return [(entry["token"], entry.get("top")) for entry in recording.tokens()]


def no_placeholders(model_dir: Path) -> dict[str, float]:
    """A ``logit_bias`` that keeps a random-weight model from writing vision placeholder tokens,
    which a reply fed back as history would carry as text (one image, two placeholders: both
    servers would fail the turn)."""
    added = json.loads((model_dir / "tokenizer.json").read_text())["added_tokens"]
    return {
        str(token["id"]): -100.0
        for token in added
        if "vision" in token["content"] or "pad" in token["content"]
    }


def chat(client: Any, image_url: str, bias: dict[str, float]) -> list[tuple[str, int]]:
    """Ten turns about one image: the image in the first user message, the history re-sent."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    replies = []
    for turn, question in enumerate(QUESTIONS):
        messages.append(user_message(question, image_url) if turn == 0 else user_message(question))
        response = client.chat.completions.create(
            model="model", messages=messages, max_tokens=5, temperature=0.0, logit_bias=bias
        )
        text = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        replies.append((text, response.usage.prompt_tokens))
    return replies


@pytest.fixture(scope="module")
def servers(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    try:
        for engine, flags in (("stock", []), ("visioncache", [SALT_FLAG, "tenant-a"])):
            root = tmp_path_factory.mktemp(f"handles-{engine}")
            started.append(ServerProcess(engine, model_dir, root, *flags).start())
        yield started
    finally:
        for server in started:
            server.stop()


def test_a_ten_turn_chat_sending_only_the_handle_answers_as_stock_resending_the_image(
    servers: list[ServerProcess], model_dir: Path
) -> None:
    stock, ours = servers
    image = image_png(800, (140, 112))
    stock_log, our_log = BodyLog(), BodyLog()
    stock_recording = Recording(stock)
    bias = no_placeholders(model_dir)
    stock_replies = chat(stock_log.openai(stock), inline(image), bias)

    our_recording = Recording(ours)
    uploaded = upload(ours, image).json()["data"][0]
    handle = uploaded["handle"]
    assert uploaded["encoded"] is True and uploaded["bytes"] == len(image)
    assert our_recording.towers() == [1]  # encoded ahead of use, at upload
    replies = chat(our_log.openai(ours), handle, bias)

    assert replies == stock_replies
    assert tokens_of(our_recording) == tokens_of(stock_recording) and all(
        top is not None for _, top in tokens_of(our_recording)
    )
    assert our_recording.towers() == [1]  # and never again
    # Measured: stock's every turn carries the image; ours carries none on any turn (the upload did).
    payload = base64.b64encode(image)
    assert len(stock_log.bodies) == len(our_log.bodies) == len(QUESTIONS)
    assert all(payload in body for body in stock_log.bodies)
    assert not any(payload in body or image in body for body in our_log.bodies)
    assert max(map(len, our_log.bodies)) < len(image) < min(map(len, stock_log.bodies))
    stats = engine_stats(ours)
    assert stats["handles_issued"] >= 1 and stats["handles_resolved"] >= len(QUESTIONS)


def test_a_handle_hits_the_entries_of_the_same_image_sent_inline(servers: list[ServerProcess]) -> None:
    _, ours = servers
    image = image_png(801)
    recording = Recording(ours)
    by_inline = ask(ours, inline(image))
    assert recording.towers() == [1]
    response = upload(ours, image, encode=False)
    assert response.status_code == 200 and response.json()["data"][0]["encoded"] is False
    assert ask(ours, response.json()["data"][0]["handle"]) == by_inline
    assert recording.towers() == [1]  # the handle names the content: the inline entry served it
    # One image uploaded again gets the same handle (content-derived, per tenant).
    assert handle_of(ours, image) == response.json()["data"][0]["handle"]


def test_malformed_forged_and_other_tenant_handles_get_their_documented_answers(
    servers: list[ServerProcess],
) -> None:
    from visioncache.integrations.handles.handle_codec import HandleCodec

    _, ours = servers
    image = image_png(802)
    real = handle_of(ours, image)
    digest = HandleCodec("tenant-a").open(real)  # the server's own codec: what it sealed
    other_tenant = HandleCodec("tenant-b").seal(digest)  # the same image, another tenant's handle
    token = real[len("visioncache://") :]
    flipped = real[:-1] + ("A" if token[-1] != "A" else "B")
    before = engine_stats(ours)
    cases = {
        "visioncache://not-a-handle": (400, "invalid_image_handle"),
        real + "A": (400, "invalid_image_handle"),
        "visioncache://" + "+" * 64: (400, "invalid_image_handle"),
        "visioncache://" + base64.urlsafe_b64encode(os.urandom(48)).decode(): (404, "unknown_image_handle"),
        flipped: (404, "unknown_image_handle"),
        other_tenant: (404, "unknown_image_handle"),
    }
    for handle, (status, code) in cases.items():
        answer = ask(ours, handle)
        assert answer[0] == status and answer[1]["code"] == code, (handle, answer)
    after = engine_stats(ours)
    assert after["handles_refused"] - before["handles_refused"] == len(cases)
    assert after["image_requests"] == before["image_requests"]  # refused before the engine saw them
    assert ask(ours, real)[0] != 400  # the real one still works


def test_an_evicted_handle_is_served_from_its_kept_bytes_then_answered_410(
    model_dir: Path, tmp_path: Path
) -> None:
    first, second = image_png(803, (112, 112)), image_png(804, (112, 112))
    budget = str(len(first) + len(first) // 2)  # the kept bytes of one image, not two
    flags = ["--vision-cache-max-embedding-entries", "1", "--vision-cache-max-handle-bytes", budget]
    with ServerProcess("visioncache", model_dir, tmp_path, *flags) as server:
        recording = Recording(server)
        first_handle = handle_of(server, first)  # features {first}, bytes {first}
        response = upload(server, second, encode=False)  # bytes {second}: first's bytes evicted
        second_handle = response.json()["data"][0]["handle"]
        assert ask(server, first_handle) == ask(server, inline(first))  # its features, without bytes
        assert recording.towers() == [1]
        by_handle = ask(server, second_handle)  # features missing: encoded from its kept bytes
        assert recording.towers() == [1, 1] and by_handle == ask(server, inline(second))
        assert engine_stats(server)["handle_images_from_kept_bytes"] == 1
        answer = ask(server, first_handle)  # neither its features (evicted by second's) nor its bytes
        assert answer[0] == 410 and answer[1]["code"] == "image_handle_expired"
        assert "send the image again" in answer[1]["message"]
        assert engine_stats(server)["handles_missing"] == 1
        assert ask(server, handle_of(server, first))[0] != 410  # uploaded again: served again


def test_handles_resolve_after_a_restart_with_a_disk_tier(model_dir: Path, tmp_path: Path) -> None:
    flags = [SALT_FLAG, "tenant-a", "--vision-cache-disk-dir", str(tmp_path / "tier")]
    image = image_png(805)
    with ServerProcess("visioncache", model_dir, tmp_path / "first", *flags) as server:
        handle = handle_of(server, image)
        before = ask(server, handle)
    with ServerProcess("visioncache", model_dir, tmp_path / "restarted", *flags) as server:
        recording = Recording(server)
        assert ask(server, handle) == before
        assert recording.towers() == []  # features from the disk tier: nothing encoded


def test_handles_resolve_on_a_second_replica_over_redis_and_nowhere_else(
    model_dir: Path, tmp_path: Path, redis_server: RedisProcess
) -> None:
    redis = ["--vision-cache-redis-url", redis_server.url, "--vision-cache-redis-prefix", "handles:"]
    image = image_png(806)

    def replica(name: str, salt: str) -> ServerProcess:
        return ServerProcess("visioncache", model_dir, tmp_path / name, SALT_FLAG, salt, *redis)

    with replica("a", "tenant-a") as first, replica("b", "tenant-a") as second:
        handle = handle_of(first, image)
        answer = ask(first, handle)
        recording = Recording(second)
        assert ask(second, handle) == answer
        assert recording.towers() == []  # features from Redis
    with replica("c", "tenant-c") as other_tenant:  # the same Redis, another salt
        refused = ask(other_tenant, handle)
        assert refused[0] == 404 and refused[1]["code"] == "unknown_image_handle"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"image": "data:image/png,%89PNG"}, 400, "invalid_image"),
        ({"image": "not base64!"}, 400, "invalid_image"),
        ({"images": []}, 400, "invalid_image"),
        ({"image": base64.b64encode(b"GIF89a not really").decode()}, 400, "invalid_image"),
        ({"image": "A" * (28 << 20)}, 413, "image_too_large"),
    ],
)
def test_bad_uploads_are_refused_with_a_clear_4xx(
    servers: list[ServerProcess], body: dict[str, Any], status: int, code: str
) -> None:
    _, ours = servers
    issued = engine_stats(ours)["handles_issued"]
    response = post(ours.base_url + "/v1/visioncache/images", json=body)
    assert response.status_code == status and response.json()["error"]["code"] == code, response.text
    assert engine_stats(ours)["handles_issued"] == issued


def test_uploads_take_raw_bytes_base64_and_data_urls_and_need_the_api_key(
    model_dir: Path, tmp_path: Path
) -> None:
    images = [image_png(807), image_png(808)]
    with ServerProcess("visioncache", model_dir, tmp_path, "--api-key", "secret-key") as server:
        url = server.base_url + "/v1/visioncache/images"
        key = {"Authorization": "Bearer secret-key"}
        assert post(url, data=images[0]).status_code == 401
        forms: list[Callable[[], Any]] = [
            lambda: post(url, data=images[0], headers=key),
            lambda: post(url, json={"image": inline(images[0])}, headers=key),
            lambda: post(
                url, json={"images": [base64.b64encode(image).decode() for image in images]}, headers=key
            ),
        ]
        answers = [form().json()["data"] for form in forms]
        assert answers[0] == answers[1] == answers[2][:1] and len(answers[2]) == 2
        handle = answers[0][0]["handle"]
        # A chat naming a handle is checked for its key first: nothing is learned without it.
        chat_url = server.base_url + "/v1/chat/completions"
        request = {"model": "model", "messages": [user_message("a", handle)], "max_tokens": 2}
        assert post(chat_url, json=request).status_code == 401
        forged = {**request, "messages": [user_message("a", "visioncache://" + "A" * 64)]}
        assert post(chat_url, json=forged).status_code == 401
        assert post(chat_url, json=request, headers=key).status_code == 200


def test_the_docs_example_runs_against_the_server(
    servers: list[ServerProcess], model_dir: Path, tmp_path: Path
) -> None:
    """docs/vllm-mlx.md's handle example (parse-only there: it needs a server) runs here as written,
    against the visioncache server, with a photo of ours."""
    from tests.support.docs_facts import ROOT
    from tests.support.markdown import fenced_blocks

    _, ours = servers
    (block,) = [b for b in fenced_blocks(ROOT / "docs" / "vllm-mlx.md") if "/visioncache/images" in b.code]
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(image_png(809))
    # Greedy, short, no placeholder tokens (see `no_placeholders`): a random-weight model.
    replacements = {
        "http://localhost:8000": ours.base_url,
        '"photo.jpg"': repr(str(photo)),
        "max_tokens=64": f"max_tokens=4, temperature=0.0, logit_bias={no_placeholders(model_dir)!r}",
    }
    code = block.code
    for old, new in replacements.items():
        assert old in code, old
        code = code.replace(old, new)
    namespace: dict[str, Any] = {}
    recording = Recording(ours)
    exec(compile(code, block.where(ROOT), "exec"), namespace)
    assert namespace["handle"].startswith("visioncache://") and len(namespace["messages"]) == 5
    assert recording.towers() == [1]  # encoded at upload, then served from the cache twice


def test_a_warm_handle_is_opened_once_and_hashes_and_reads_nothing(model_dir: Path, tmp_path: Path) -> None:
    # The kept bytes live in the disk tier only (a 1-byte memory budget for them); the features in
    # memory. A warm request must not touch the kept bytes at all: it used to read them back from
    # the tier and hash them before looking for the features, and open its handle twice.
    flags = ["--vision-cache-disk-dir", str(tmp_path / "tier"), "--vision-cache-max-handle-bytes", "1"]
    image = image_png(810, (112, 112))
    with ServerProcess("visioncache", model_dir, tmp_path / "server", *flags) as server:
        handle = handle_of(server, image)  # encoded at upload: its features are in memory
        recording = Recording(server)
        first = ask(server, handle)
        assert first == ask(server, inline(image)) and recording.towers() == []
        reads = Reads(server)
        assert ask(server, handle) == first
        assert reads.hashed() == [] and reads.tier_bytes() == 0
        assert reads.opened() == 1  # the handle check opened it; the scheduler step took what it found


def test_an_upload_hashes_each_image_once(servers: list[ServerProcess]) -> None:
    _, ours = servers
    images = [image_png(811), image_png(812)]
    for options in ({}, {"encode": False}):  # encoded at once (a miss), or only kept
        reads = Reads(ours)
        response = upload(ours, *images, **options)
        assert response.status_code == 200, response.text
        assert sorted(reads.hashed()) == sorted(map(len, images)), options


def test_features_encoded_again_from_kept_bytes_hash_them_once(servers: list[ServerProcess]) -> None:
    _, ours = servers
    image = image_png(813)
    handle = upload(ours, image, encode=False).json()["data"][0]["handle"]  # kept, not encoded
    recording, reads = Recording(ours), Reads(ours)
    answer = ask(ours, handle)
    assert answer[0] not in (400, 404, 410), answer
    assert recording.towers() == [1]
    assert reads.hashed() == [len(image)]  # verified once, against the handle's digest
    assert reads.opened() == 1


def half_png() -> bytes:
    """The first half of a valid PNG: its signature and header parse, its pixels are cut."""
    image = image_png(814, (112, 112))
    return image[: len(image) // 2]


def upload_forms(image: bytes) -> dict[str, Callable[[str], Any]]:
    """Every way to upload ``image``, raw and JSON, with and without encoding, by name."""
    encoded = base64.b64encode(image).decode()
    return {
        "raw": lambda url: post(url, data=image, headers={"content-type": "image/png"}),
        "raw, ?encode=false": lambda url: post(
            url + "?encode=false", data=image, headers={"content-type": "image/png"}
        ),
        "JSON": lambda url: post(url, json={"image": encoded}),
        "JSON, encode false": lambda url: post(url, json={"image": encoded, "encode": False}),
    }


def assert_refused_as_json(response: Any, form: str) -> None:
    assert response.status_code == 400, (form, response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == "invalid_image" and error["type"] == "invalid_request_error", form
    assert (
        "not an image the engine can read" in error["message"] or "could not be encoded" in error["message"]
    )


def test_regression_half_a_png_uploaded_without_encoding_was_a_plain_text_500(
    servers: list[ServerProcess],
) -> None:
    _, ours = servers
    issued = engine_stats(ours)["handles_issued"]
    for form, send in upload_forms(half_png()).items():
        assert_refused_as_json(send(ours.base_url + "/v1/visioncache/images"), form)
    assert engine_stats(ours)["handles_issued"] == issued


def test_regression_a_bad_upload_before_a_lazy_engine_was_built_was_a_plain_text_500(
    model_dir: Path, tmp_path: Path
) -> None:
    image = image_png(815)
    with ServerProcess("visioncache", model_dir, tmp_path, "--lazy-load-model") as server:
        url = server.base_url + "/v1/visioncache/images"
        for form, send in upload_forms(half_png()).items():
            assert_refused_as_json(send(url), form)
        uploaded = upload(server, image).json()["data"][0]
        assert uploaded["encoded"] is False and uploaded["kept"] is True  # no engine yet
        by_handle = ask(server, uploaded["handle"])  # the engine, built now (its self-check runs
        assert by_handle[0] not in (400, 404, 410), by_handle  # the tower), encodes the kept bytes
        recording = Recording(server)
        assert ask(server, inline(image)) == by_handle
        assert recording.towers() == []  # the handle's encode was the image's


def test_regression_an_image_too_large_to_keep_without_a_tier_was_answered_as_kept(
    model_dir: Path, tmp_path: Path
) -> None:
    small, large = image_png(816, (84, 84)), image_png(817, (140, 140))
    budget = str(len(small) + 100)
    with ServerProcess(
        "visioncache", model_dir, tmp_path, "--vision-cache-max-handle-bytes", budget
    ) as server:
        answers = [upload(server, image).json()["data"][0] for image in (small, large)]
        assert [answer["encoded"] for answer in answers] == [True, True]
        assert answers[0]["kept"] is True and "reason" not in answers[0]
        assert answers[1]["kept"] is False
        assert (
            "--vision-cache-max-handle-bytes" in answers[1]["reason"]
            and str(len(large)) in answers[1]["reason"]
        )
        assert engine_stats(server)["handle_bytes_entries"] == 1  # as answered: the large one is not kept
