"""serve-mlx reads every image as stock vllm-mlx reads it (#18.7): an http(s) URL is fetched on every
request and its content, not its text, names the cache entry; a ``data:`` URL is decoded the way
stock decodes it. So whatever the URL serves now (other content, a 404, a redirect), and whatever
is cached, serve-mlx answers as stock does.

The images come from a local HTTP server on loopback (`tests.support.media_server`), which both
servers are allowed to fetch from (``allow_loopback_media``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes

import pytest

from tests.integrations.vllm_mlx.chat import client_for, complete, image_png, user_message
from tests.integrations.vllm_mlx.test_vllm_mlx_server import Recording
from tests.support.media_server import MediaServer, Route
from tests.support.vllm_mlx_server import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    try:
        for engine in ("stock", "visioncache"):
            root = tmp_path_factory.mktemp(f"media-{engine}")
            started.append(ServerProcess(engine, model_dir, root, allow_loopback_media=True).start())
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def media() -> Iterator[MediaServer]:
    with MediaServer() as server:
        yield server


def ask(server: ServerProcess, url: str) -> tuple[Any, list[int], list[dict[str, Any]]]:
    """One request with one image: the reply (or the error's status and body), the tower calls
    and the tokens (with top log-probs) it cost."""
    from openai import APIStatusError

    recording = Recording(server)
    try:
        reply: Any = complete(client_for(server.base_url), [user_message("describe the image", url)], 5)
    except APIStatusError as error:
        reply = (error.status_code, error.body)
    return reply, recording.towers(), recording.tokens()


def ask_both(servers: list[ServerProcess], url: str) -> dict[str, tuple[Any, list[int], list[Any]]]:
    return {server.engine: ask(server, url) for server in servers}


def assert_answered_as_stock(results: dict[str, tuple[Any, list[int], list[Any]]]) -> None:
    (stock, _, stock_tokens), (ours, _, tokens) = results["stock"], results["visioncache"]
    assert ours == stock
    assert tokens == stock_tokens


def test_regression_http_image_url_keyed_by_its_text(
    servers: list[ServerProcess], media: MediaServer
) -> None:
    media.routes["/photo.png"] = Route(body=image_png(700))
    url = media.url("/photo.png")
    assert_answered_as_stock(ask_both(servers, url))
    media.routes["/photo.png"] = Route(body=image_png(701))  # the URL now serves other content
    results = ask_both(servers, url)
    assert_answered_as_stock(results)
    assert results["visioncache"][1] == [1]  # the new content was encoded, not served from the old
    # Fetched on every request, as stock fetches (three requests each), and keyed by content:
    # the same content again is a hit.
    assert ask(servers[1], url)[1] == []
    assert media.fetches("/photo.png") == 2 + 2 + 1


def test_regression_http_image_url_served_from_cache_after_a_404(
    servers: list[ServerProcess], media: MediaServer
) -> None:
    media.routes["/gone.png"] = Route(body=image_png(702))
    url = media.url("/gone.png")
    assert_answered_as_stock(ask_both(servers, url))
    media.routes["/gone.png"] = Route(404, b"not found")
    results = ask_both(servers, url)
    assert_answered_as_stock(results)
    assert isinstance(results["stock"][0], tuple) and results["stock"][0][0] >= 400  # an error


def test_regression_http_image_url_served_from_cache_after_a_redirect(
    servers: list[ServerProcess], media: MediaServer
) -> None:
    media.routes["/moved.png"] = Route(body=image_png(703))
    media.routes["/new-home.png"] = Route(body=image_png(704))
    url = media.url("/moved.png")
    assert_answered_as_stock(ask_both(servers, url))
    media.routes["/moved.png"] = Route(302, headers={"Location": "/new-home.png"})
    results = ask_both(servers, url)
    assert_answered_as_stock(results)
    assert results["visioncache"][1] == [1]  # the redirect's target, encoded
    assert media.fetches("/new-home.png") == 2


def test_regression_http_image_url_name_survives_a_restart_in_the_disk_tier(
    model_dir: Path, tmp_path: Path, media: MediaServer
) -> None:
    disk = ["--vision-cache-disk-dir", str(tmp_path / "tier")]
    url, second = media.url("/photo.png"), image_png(706)
    media.routes["/photo.png"] = Route(body=image_png(705))
    with ServerProcess(
        "visioncache", model_dir, tmp_path / "first", *disk, allow_loopback_media=True
    ) as server:
        assert ask(server, url)[1] == [1]
    media.routes["/photo.png"] = Route(body=second)
    restarted = ServerProcess(
        "visioncache", model_dir, tmp_path / "restarted", *disk, allow_loopback_media=True
    )
    with restarted as server:
        reply, towers, _ = ask(server, url)
        assert towers == [1]  # the new content, not the first server's entry for the URL's text
        inline = "data:image/png;base64," + base64.b64encode(second).decode()
        assert ask(server, inline)[:2] == (reply, [])  # the same content inline: a hit, the same answer


def test_regression_percent_encoded_data_url_answer_depends_on_what_is_cached(
    servers: list[ServerProcess],
) -> None:
    cached, never_cached = image_png(710), image_png(711)
    assert_answered_as_stock(ask_both(servers, "data:image/png;base64," + base64.b64encode(cached).decode()))
    for content in (cached, never_cached):
        results = ask_both(servers, "data:image/png," + quote_from_bytes(content))
        assert_answered_as_stock(results)
