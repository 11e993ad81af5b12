"""Image handles in vLLM's OpenAI server (``--middleware visioncache.integrations.vllm.VisionCacheHandles``),
on real vLLM servers through the ``openai`` client.

Three servers start together: stock vLLM (the reference, images inline), one with the middleware
(client ``uuid`` s refused) and one with the middleware and the encoder-cache connector (client
``uuid`` s scoped under the tenant). Outputs are token ids and top-5 logprobs (`servers.chat`).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_ec.conftest import ec_config
from tests.integrations.vllm_ec.servers import VllmServer, chat
from tests.integrations.vllm_ec.workload import QUESTIONS, image_data_url

MIDDLEWARE = ("--middleware", "visioncache.integrations.vllm.VisionCacheHandles")
TURNS = 10


@pytest.fixture(scope="module")
def servers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    workdir = tmp_path_factory.mktemp("handles")
    started = {
        "stock": VllmServer(tiny_model, workdir, name="stock"),
        "handles": VllmServer(tiny_model, workdir, name="handles", flags=MIDDLEWARE),
        "handles_ec": VllmServer(
            tiny_model,
            workdir,
            ec_config(disk_dir=str(workdir / "tier")),
            name="handles_ec",
            env={"VISIONCACHE_HANDLE_CLIENT_UUIDS": "scope"},
            flags=MIDDLEWARE,
        ),
    }
    for server in started.values():
        server.start()
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


def _png(seed: int) -> bytes:
    return base64.b64decode(image_data_url(seed).split(",", 1)[1])


def post(server: VllmServer, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    """(status, parsed JSON body) of a POST; a body that is not JSON fails the test."""
    request = urllib.request.Request(server.url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def upload(server: VllmServer, image: bytes, api_key: str | None = None) -> str:
    headers = {"Content-Type": "image/png", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    status, answer = post(server, "/v1/visioncache/images", image, headers)
    assert status == 200, answer
    (issued,) = answer["data"]
    assert issued["kept"] is True and issued["bytes"] == len(image)
    handle: str = issued["handle"]
    return handle


class OneImageChat:
    """One user's chat of `TURNS` turns about one image, the image in the first turn's message
    (resent with the history every turn, as OpenAI-style clients do)."""

    processor_kwargs = ()

    def __init__(self, url: str, uuid: str | None = None) -> None:
        self.url, self.uuid = url, uuid

    def requests(self, turns: int = TURNS) -> list[tuple[int, int]]:
        return [(0, turn) for turn in range(turns)]

    def messages(self, user: int, turn: int, replies: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
        part: dict[str, Any] = {"type": "image_url", "image_url": {"url": self.url}}
        if self.uuid is not None:
            part["uuid"] = self.uuid
        messages: list[dict[str, Any]] = []
        for earlier in range(turn + 1):
            text = {"type": "text", "text": QUESTIONS[earlier % len(QUESTIONS)]}
            messages.append({"role": "user", "content": [part, text] if earlier == 0 else [text]})
            if earlier < turn:
                messages.append({"role": "assistant", "content": replies[(user, earlier)]})
        return messages


def answers(
    server: VllmServer, conversation: OneImageChat, turns: int = TURNS, api_key: str = "unused"
) -> list[Any]:
    ran = chat(server, conversation, conversation.requests(turns), {}, api_key)  # type: ignore[arg-type]
    assert ran["failed"] == 0
    outputs: list[Any] = ran["outputs"]
    return outputs


def test_a_ten_turn_chat_with_one_upload_gives_the_tokens_of_stock_vllm_with_the_image_inline(
    servers: dict[str, VllmServer],
) -> None:
    image = _png(11)
    inline = OneImageChat(image_data_url(11))
    reference = answers(servers["stock"], inline)
    for name in ("handles", "handles_ec"):
        server = servers[name]
        handle = upload(server, image, api_key="unused")
        assert upload(server, image, api_key="unused") == handle  # one image, one handle (per tenant)
        conversation = OneImageChat(handle)
        before = server.encoded()
        assert answers(server, conversation) == reference, name
        assert server.encoded() - before == 1, name  # encoded once, for ten turns
        last = json.dumps(conversation.messages(0, TURNS - 1, dict.fromkeys(conversation.requests(), "x")))
        inline_last = json.dumps(inline.messages(0, TURNS - 1, dict.fromkeys(inline.requests(), "x")))
        assert len(inline_last) > 10 * len(last)  # what the client sends each turn


def test_a_forged_uuid_poisons_stock_vllm_and_cannot_change_an_answer_through_the_middleware(
    servers: dict[str, VllmServer],
) -> None:
    import openai

    victim, other = image_data_url(21), image_data_url(22)
    honest = answers(servers["stock"], OneImageChat(other), turns=1)
    # Stock vLLM: an image sent under a name, then another image under the same name, gets the first
    # image's answer (its item identifier is the client's word).
    stock_victim = answers(servers["stock"], OneImageChat(victim, uuid="shared-name"), turns=1)
    poisoned = answers(servers["stock"], OneImageChat(other, uuid="shared-name"), turns=1)
    assert stock_victim != honest
    assert poisoned == stock_victim

    # Refused: no client identifier reaches vLLM.
    handles = servers["handles"]
    answers(handles, OneImageChat(victim), turns=1)
    client = openai.OpenAI(base_url=handles.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=handles.model,
            messages=OneImageChat(other, uuid="shared-name").messages(0, 0, {}),  # type: ignore[arg-type]
            max_tokens=2,
        )
    assert refused.value.status_code == 400
    assert refused.value.code == "client_media_id_refused"

    # Scoped: a name is the tenant's own, and can never be a handle's server-derived identifier.
    from visioncache.integrations.handles import Handles
    from visioncache.integrations.vllm.handle_tenants import tenant_of

    scoped = servers["handles_ec"]
    victim_handle = upload(scoped, _png(21), api_key="victim")
    assert answers(scoped, OneImageChat(victim_handle), turns=1, api_key="victim") == stock_victim
    assert (
        answers(scoped, OneImageChat(victim, uuid="shared-name"), turns=1, api_key="victim") == stock_victim
    )
    (digest,) = Handles(None, None, 0).kept.image_digests([_png(21)])
    for tenant, name in (
        ("attacker", "shared-name"),  # another tenant's word
        ("victim", tenant_of(None, "victim", None).image_id(digest)),  # the handle's identifier itself
        ("attacker", tenant_of(None, "victim", None).image_id(digest)),
    ):
        assert answers(scoped, OneImageChat(other, uuid=name), turns=1, api_key=tenant) == honest, (
            tenant,
            name,
        )


def test_bad_uploads_and_handles_are_4xx_with_a_json_error_body(servers: dict[str, VllmServer]) -> None:
    server = servers["handles"]
    png = _png(31)
    json_type = {"Content-Type": "application/json"}
    for body, headers, status in (
        (png[: len(png) // 2], {"Content-Type": "image/png"}, 400),  # half a PNG
        (b"", {"Content-Type": "image/png"}, 400),
        (b"not an image", {"Content-Type": "application/octet-stream"}, 400),
        (b"{not json", json_type, 400),
        (json.dumps({"image": "%%%"}).encode(), json_type, 400),
        (json.dumps({"images": [base64.b64encode(png).decode()] * 17}).encode(), json_type, 400),
        (json.dumps({"image": "A" * (28 << 20)}).encode(), json_type, 413),
    ):
        answered, answer = post(server, "/v1/visioncache/images", body, headers)
        assert answered == status, answer
        assert answer["error"]["message"]

    handle = upload(server, png)
    forged = handle[:-8] + ("A" * 8 if not handle.endswith("A" * 8) else "B" * 8)
    for url, status, code in (
        ("visioncache://short", 400, "invalid_image_handle"),
        (forged, 404, "unknown_image_handle"),
    ):
        body = {"model": server.model, "messages": OneImageChat(url).messages(0, 0, {}), "max_tokens": 2}
        answered, answer = post(server, "/v1/chat/completions", json.dumps(body).encode(), json_type)
        assert (answered, answer["error"]["code"]) == (status, code)


def test_tenants_do_not_share_handles(servers: dict[str, VllmServer]) -> None:
    server = servers["handles"]
    png = _png(41)
    alice = upload(server, png, api_key="alice")
    assert upload(server, png, api_key="bob") != alice
    json_type = {"Content-Type": "application/json"}
    body = {"model": server.model, "messages": OneImageChat(alice).messages(0, 0, {}), "max_tokens": 2}
    for headers, status in (
        ({"Authorization": "Bearer bob"}, 404),
        ({}, 404),
        ({"Authorization": "Bearer alice"}, 200),
    ):
        answered, answer = post(
            server, "/v1/chat/completions", json.dumps(body).encode(), json_type | headers
        )
        assert answered == status, answer
    # A cache_salt selects the tenant over the key: alice's handle is unknown under a salt.
    salted = {**body, "cache_salt": "a-tenant-salt"}
    answered, answer = post(
        server,
        "/v1/chat/completions",
        json.dumps(salted).encode(),
        json_type | {"Authorization": "Bearer alice"},
    )
    assert (answered, answer["error"]["code"]) == (404, "unknown_image_handle")


def test_a_handle_to_an_image_the_connector_holds_costs_no_encode(servers: dict[str, VllmServer]) -> None:
    """vLLM names the image sent inline by its content hash and the handle's by the server's
    ``uuid``, so its own encoder cache misses; the connector keys both by what the encoder is given:
    with it the handle costs no encode, without it one."""
    image = _png(51)
    for name, encodes in (("handles_ec", 0), ("handles", 1)):
        server = servers[name]
        stored = _tier_files(server)
        inline = answers(server, OneImageChat(image_data_url(51)), turns=1)
        deadline = time.monotonic() + 60
        while name == "handles_ec" and _tier_files(server) == stored:  # saved in the background
            assert time.monotonic() < deadline, "the inline image's encoder output never reached the tier"
            time.sleep(0.2)
        handle = upload(server, image, api_key="unused")
        before = server.encoded()
        assert answers(server, OneImageChat(handle), turns=1) == inline
        assert server.encoded() - before == encodes, name


def _tier_files(server: VllmServer) -> set[tuple[str, int, int]]:
    """What the disk tier's files are (name, size, modification time): a save changes them."""
    tier = server.log.parent / "tier"
    return {(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in tier.rglob("*") if p.is_file()}
