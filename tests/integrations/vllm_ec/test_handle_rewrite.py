"""The handle middleware for vLLM's OpenAI server, in process around a recording application:
what vLLM is given for a request naming handles or client identifiers (no engine started)."""

from __future__ import annotations

import asyncio
import base64
import json
from types import SimpleNamespace
from typing import Any

import pytest

from tests.integrations.vllm_ec.workload import image_data_url
from visioncache.integrations.vllm import VisionCacheHandles
from visioncache.integrations.vllm.handle_tenants import tenant_of


class Recorder:
    """The application behind the middleware: records each body it is given, answers 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        assert dict(scope["headers"])[b"content-length"] == str(len(body)).encode()
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def call(
    middleware: VisionCacheHandles,
    body: bytes,
    api_key: str | None = None,
    path: str = "/v1/chat/completions",
    app: Any = None,
) -> tuple[int, Any]:
    """POST ``body`` to ``path`` through ``middleware`` (in vLLM's ``app``): (status, JSON answer)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if api_key is not None:
        headers.append((b"authorization", f"Bearer {api_key}".encode()))
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "app": app}
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[Any] = []

    async def receive() -> Any:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def chat_body(url: str, **part: Any) -> bytes:
    content = [{"type": "image_url", "image_url": {"url": url}, **part}, {"type": "text", "text": "hi"}]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()


def png(seed: int) -> bytes:
    return base64.b64decode(image_data_url(seed).split(",", 1)[1])


@pytest.fixture
def app() -> Recorder:
    return Recorder()


def test_a_handle_becomes_its_verified_bytes_under_a_server_derived_uuid(app: Recorder) -> None:
    middleware = VisionCacheHandles(app, {})
    image = png(1)
    tenant = tenant_of(None, "k", None)
    (issued,) = middleware.upload([image], tenant)["data"]
    assert call(middleware, chat_body(issued["handle"]), api_key="k")[0] == 200
    (part, _) = json.loads(app.bodies[-1])["messages"][0]["content"]
    assert base64.b64decode(part["image_url"]["url"].split(",", 1)[1]) == image
    (digest,) = middleware.handles.kept.image_digests([image])
    assert part["uuid"] == tenant.image_id(digest)
    assert part["uuid"] != tenant_of(None, "other", None).image_id(digest)  # ids are per tenant


def test_a_body_without_handles_or_identifiers_reaches_vllm_unchanged(app: Recorder) -> None:
    body = chat_body(image_data_url(2))
    assert call(VisionCacheHandles(app, {}), body)[0] == 200
    assert app.bodies == [body]


@pytest.mark.parametrize(
    "body",
    [
        chat_body("data:,", uuid="a-name"),
        # a JSON escape spells the key: a scan for '"uuid"' alone would let it through
        chat_body("data:,", uuid="a-name").replace(b'"uuid"', b'"\\u0075uid"'),
        json.dumps({"prompt": {"multi_modal_uuids": {"image": ["a-name"]}}}).encode(),
        json.dumps({"content_parts": [{"type": "image_url", "url": "data:,", "uuid": "a-name"}]}).encode(),
    ],
    ids=["part-uuid", "escaped-key", "multi-modal-uuids", "content-parts"],
)
def test_client_identifiers_are_refused_or_scoped_under_the_tenant(app: Recorder, body: bytes) -> None:
    status, answer = call(VisionCacheHandles(app, {}), body)
    assert (status, answer["error"]["code"]) == (400, "client_media_id_refused")
    assert app.bodies == []

    scoping = VisionCacheHandles(app, {"VISIONCACHE_HANDLE_CLIENT_UUIDS": "scope"})
    for key in ("alice", "bob"):
        assert call(scoping, body, api_key=key)[0] == 200
    alice, bob = (json.loads(sent) for sent in app.bodies)
    assert b"a-name" not in app.bodies[0] and alice != bob
    assert tenant_of(None, "alice", None).client_id("a-name") in app.bodies[0].decode()


def test_a_handle_outside_its_tenant_or_forged_is_refused_before_vllm(app: Recorder) -> None:
    middleware = VisionCacheHandles(app, {"VISIONCACHE_HANDLE_SECRET": "s"})
    (issued,) = middleware.upload([png(3)], tenant_of(None, "alice", "s"))["data"]
    handle = issued["handle"]
    for api_key, body, code in (
        ("bob", chat_body(handle), "unknown_image_handle"),
        (None, chat_body(handle), "unknown_image_handle"),
        ("alice", chat_body(handle[:-1] + ("A" if handle[-1] != "A" else "B")), "unknown_image_handle"),
        ("alice", chat_body("visioncache://nope"), "invalid_image_handle"),
    ):
        status, answer = call(middleware, body, api_key)
        assert answer["error"]["code"] == code and status in (400, 404)
    assert app.bodies == []
    assert call(middleware, chat_body(handle), "alice")[0] == 200


def test_a_handle_whose_bytes_are_gone_is_410(app: Recorder) -> None:
    middleware = VisionCacheHandles(app, {})
    image = png(4)
    (issued,) = middleware.upload([image], tenant_of(None, None, None))["data"]
    assert middleware.handles.kept.discard_images([image]) == 1
    status, answer = call(middleware, chat_body(issued["handle"]))
    assert (status, answer["error"]["code"]) == (410, "image_handle_expired")


def test_vllms_api_keys_are_checked_before_a_handle_is_opened_or_an_upload_kept(app: Recorder) -> None:
    """vLLM's ``--api-key`` guards the upload as it guards its own routes; a chat request that
    fails it reaches vLLM untouched (vLLM answers 401): no handle is opened for it."""
    vllm_app = SimpleNamespace(state=SimpleNamespace(args=SimpleNamespace(api_key=["right"])))
    middleware = VisionCacheHandles(app, {})
    image = base64.b64encode(png(5)).decode()
    upload = json.dumps({"image": image}).encode()
    for api_key in (None, "wrong"):
        status, answer = call(middleware, upload, api_key, "/v1/visioncache/images", vllm_app)
        assert (status, answer) == (401, {"error": "Unauthorized"})
    assert middleware.handles.counters()["handles_issued"] == 0
    status, answer = call(middleware, upload, "right", "/v1/visioncache/images", vllm_app)
    assert status == 200
    handle = answer["data"][0]["handle"]
    assert call(middleware, chat_body(handle), "wrong", app=vllm_app)[0] == 200  # the recorder's answer
    assert app.bodies == [chat_body(handle)]  # untouched: vLLM's own check refuses it
    assert middleware.handles.counters()["handles_resolved"] == 0
