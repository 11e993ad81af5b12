"""Tenants per request by API key in serve-mlx (`visioncache.integrations.vllm_mlx.tenants`), on
the real server through the real ``openai`` client: features, KV prefixes and image handles apart
per tenant; unknown keys get stock's 401; ``DELETE /v1/visioncache/images/{handle}`` forgets an
image for its tenant, in memory and on the disk tier.

One server (tenants from an environment variable, a disk tier) serves the module; its vision
tower calls are counted on the model and its own counters read from ``/v1/cache/stats``.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_mlx.chat import SYSTEM, image_png, image_url, user_message
from tests.integrations.vllm_mlx.test_vllm_mlx_server import Recording
from tests.support.vllm_mlx_server import ServerProcess

pytestmark = pytest.mark.slow

KEY_A, KEY_A2, KEY_B = "key-of-tenant-a", "second-key-of-tenant-a", "key-of-tenant-b"
TENANTS = {KEY_A: "secret-of-tenant-a", KEY_A2: "secret-of-tenant-a", KEY_B: "secret-of-tenant-b"}
FLAGS = ("--vision-cache-tenants-env", "VC_TENANTS")


def _serve(model_dir: Path, root: Path, tier: Path) -> ServerProcess:
    flags = (*FLAGS, "--vision-cache-disk-dir", str(tier))
    return ServerProcess(
        "visioncache", model_dir, root, *flags, environment={"VC_TENANTS": json.dumps(TENANTS)}
    )


def _per_request(tokens: list[dict[str, Any]]) -> list[list[tuple[Any, Any]]]:
    """The recorded tokens (with top log-probs) of each request, in order."""
    requests: list[list[tuple[Any, Any]]] = [[]]
    for entry in tokens:
        requests[-1].append((entry["token"], entry.get("top")))
        if entry.get("finish_reason") is not None:
            requests.append([])
    return [request for request in requests if request]


def _inline(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tenants-tier") / "tier"


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory, tier: Path) -> Iterator[ServerProcess]:
    started = _serve(model_dir, tmp_path_factory.mktemp("tenants"), tier).start()
    try:
        yield started
    finally:
        started.stop()


def _client(server: ServerProcess, key: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0, timeout=120)


def _ask(server: ServerProcess, key: str, image: str, text: str = "describe the image") -> tuple[Any, float]:
    """One request: (its reply, or (status, error body); seconds until it answered)."""
    from openai import APIStatusError

    messages = [{"role": "system", "content": SYSTEM}, user_message(text, image)]
    started = time.perf_counter()
    try:
        response = _client(server, key).chat.completions.create(
            model="model", messages=messages, max_tokens=4, temperature=0.0
        )
    except APIStatusError as error:
        return (error.status_code, error.body), time.perf_counter() - started
    return response.choices[0].message.content, time.perf_counter() - started


def _http(server: ServerProcess, method: str, path: str, key: str | None, body: bytes | None = None) -> Any:
    request = urllib.request.Request(server.base_url + path, data=body, method=method)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        request.add_header("Content-Type", "image/png")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _stats(server: ServerProcess) -> dict[str, Any]:
    status, body = _http(server, "GET", "/v1/cache/stats", KEY_A)
    assert status == 200, body
    stats: dict[str, Any] = body["engine_cache"]["vision_embedding_cache"]
    return stats


def _upload(server: ServerProcess, key: str, image: bytes) -> str:
    status, body = _http(server, "POST", "/v1/visioncache/images", key, image)
    assert status == 200, body
    handle: str = body["data"][0]["handle"]
    return handle


def test_unknown_or_missing_keys_get_stocks_401(server: ServerProcess) -> None:
    for key, detail in (("not-a-tenant", "Invalid API key"), (None, "API key required")):
        assert _http(server, "GET", "/v1/models", key) == (401, {"detail": detail})
        assert _http(server, "POST", "/v1/visioncache/images", key, image_png(900)) == (
            401,
            {"detail": detail},
        )
    answer, _ = _ask(server, "not-a-tenant", image_url(900))
    assert answer[0] == 401


def test_tenant_bs_first_request_for_tenant_as_image_costs_an_encode(server: ServerProcess) -> None:
    # The timing probe: on a shared cache B's request would be a hit (about a millisecond of
    # lookup against an encode), telling B that A sent the image. Measured in the engine's own
    # counters and on the model's tower.
    recording, before = Recording(server), _stats(server)
    image = image_url(901)
    first, first_seconds = _ask(server, KEY_A, image)
    again, again_seconds = _ask(server, KEY_A2, image)  # tenant A, its other key: a hit
    other, other_seconds = _ask(server, KEY_B, image)  # tenant B: encoded again
    after = _stats(server)
    assert recording.towers() == [1, 1]
    assert after["images_encoded"] - before["images_encoded"] == 2
    assert after["vision_tower_calls"] - before["vision_tower_calls"] == 2
    assert first == again == other  # greedy tokens do not depend on the tenant
    per_request = _per_request(recording.tokens())
    assert len(per_request) == 3 and per_request[0] == per_request[1] == per_request[2]  # with logprobs
    print(f"tenant probe: A {first_seconds:.3f} s, A again {again_seconds:.3f} s, B {other_seconds:.3f} s")


def test_kv_prefixes_are_not_shared_between_tenants(server: ServerProcess) -> None:
    image = image_url(902)
    _ask(server, KEY_A, image, "describe the image")
    before = _stats(server)
    _ask(server, KEY_A, image, "describe the image now")  # A's longer prompt: A's prefix
    middle = _stats(server)
    _ask(server, KEY_B, image, "describe the image now")  # B's identical prompt: nothing of A's
    after = _stats(server)
    assert middle["kv_prefix_hits"] - before["kv_prefix_hits"] == 1
    assert after["kv_prefix_hits"] == middle["kv_prefix_hits"]
    assert after["kv_tokens_reused"] == middle["kv_tokens_reused"]


def test_handles_are_sealed_per_tenant(server: ServerProcess) -> None:
    image = image_png(903)
    handle_a, handle_b = _upload(server, KEY_A, image), _upload(server, KEY_B, image)
    assert handle_a != handle_b and _upload(server, KEY_A2, image) == handle_a
    answer, _ = _ask(server, KEY_B, handle_a)
    assert answer[0] == 404 and answer[1]["code"] == "unknown_image_handle"
    assert _ask(server, KEY_A, handle_a)[0] == _ask(server, KEY_B, handle_b)[0]


def test_delete_forgets_an_image_for_its_tenant_only(server: ServerProcess) -> None:
    image = image_png(904)
    inline = _inline(image)
    handle = _upload(server, KEY_A, image)  # encoded at upload, bytes kept
    _ask(server, KEY_A, handle, "describe the image")  # and a KV prefix stored
    _ask(server, KEY_B, inline)
    assert _http(server, "DELETE", "/v1/visioncache/images/" + handle, KEY_B)[0] == 404  # not B's handle
    status, body = _http(server, "DELETE", "/v1/visioncache/images/" + handle, KEY_A)
    assert status == 200 and body["deleted"] is True, body
    assert body["features"] >= 2 and body["kv_prefixes"] >= 1 and body["kept_bytes"] >= 2  # memory + disk
    answer, _ = _ask(server, KEY_A, handle)
    assert answer[0] == 410  # neither features nor bytes are held for A any more
    recording = Recording(server)
    _ask(server, KEY_A, inline)  # encoded again
    _ask(server, KEY_B, inline)  # B's copy stays
    assert recording.towers() == [1]


def test_after_a_restart_each_tenants_entries_are_found_and_a_deleted_image_is_not(
    server: ServerProcess, model_dir: Path, tmp_path: Path, tier: Path
) -> None:
    image = image_png(905)
    inline = _inline(image)
    handle = _upload(server, KEY_A, image)
    _ask(server, KEY_B, inline)
    assert _http(server, "DELETE", "/v1/visioncache/images/" + handle, KEY_A)[0] == 200
    server.stop()  # flushes the tier
    with _serve(model_dir, tmp_path, tier) as restarted:
        recording = Recording(restarted)
        _ask(restarted, KEY_B, inline)  # from the disk tier
        assert recording.towers() == []
        _ask(restarted, KEY_A, inline)  # deleted from the disk tier too
        assert recording.towers() == [1]
