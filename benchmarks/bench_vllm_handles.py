"""Image handles in vLLM's OpenAI server: a multi-turn image chat that uploads once and then sends
the handle, against the same chat re-sending the image inline on every turn, side by side.

    .venv-vllm/bin/python benchmarks/bench_vllm_handles.py [--turns 10] [--image-size 1024]
                                                           [--max-tokens 8] [--json PATH]

Two vLLM 0.32 OpenAI servers (``python -m vllm.entrypoints.openai.api_server``, as
`tests/integrations/vllm_ec/servers.py` starts them) on loopback, serving the tiny random-weight
Qwen2-VL of the vLLM tests: stock vLLM, sent the image (a photo-like JPEG as a base64 data URL in the
first user message of the history, as OpenAI clients send it) every turn, and vLLM with
``--middleware visioncache.integrations.vllm.VisionCacheHandles``, sent the image once (``POST
/v1/visioncache/images``, raw bytes) and then its handle. Each turn is streamed to the two in turn,
one request at a time, so machine noise falls on both alike; each server first answers one
untimed request about another image.

Per turn it prints the request bytes each client sent (bodies as the ``openai`` client's HTTP
client sent them) and the time to first token (first streamed token, client side), with their
ratios. (Server side, each turn's image is hashed once either way: stock vLLM hashes the inline
image to name it; with a handle the middleware verifies the kept bytes against the handle's digest
and vLLM, given the server's ``uuid``, hashes none. Not measured here.) It exits 1 if the two
servers' greedy tokens or top-5 log-probs differ anywhere.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.integrations.vllm_ec: servers

from openai import DefaultHttpxClient, OpenAI

from tests.integrations.vllm_ec.servers import VllmServer
from tests.integrations.vllm_ec.tiny_model import save_tiny_qwen2_vl
from tests.integrations.vllm_ec.workload import image_data_url

from _timing import print_table

QUESTIONS = (
    "What is in this photo?",
    "What colours dominate?",
    "Is there anyone in it?",
    "What is in the background?",
    "Is there any text?",
    "Where could it have been taken?",
    "What time of day is it?",
    "What is on the left?",
    "And on the right?",
    "Summarise it in one sentence.",
)
MIDDLEWARE = ("--middleware", "visioncache.integrations.vllm.VisionCacheHandles")


class Client:
    """An ``openai`` client on one server whose HTTP client counts the request bytes it sends."""

    def __init__(self, server: VllmServer) -> None:
        self.sent, self.model = 0, server.model
        http = DefaultHttpxClient(event_hooks={"request": [self._count]}, timeout=600)
        self.openai = OpenAI(base_url=server.url + "/v1", api_key="unused", http_client=http, max_retries=0)

    def _count(self, request: Any) -> None:
        self.sent += len(request.read())

    def upload(self, image: bytes) -> tuple[str, dict[str, float]]:
        """``POST /v1/visioncache/images`` with the raw bytes: the handle, its bytes and time."""
        before, started = self.sent, time.perf_counter()
        answer: Any = self.openai.post(
            "/visioncache/images",
            cast_to=object,
            content=image,
            options={"headers": {"Content-Type": "image/jpeg"}},
        )
        seconds = time.perf_counter() - started
        return answer["data"][0]["handle"], {"bytes": self.sent - before, "seconds": seconds}

    def send(
        self, messages: list[dict[str, Any]], max_tokens: int
    ) -> tuple[str, list[Any], dict[str, float]]:
        """Stream one turn: the reply, its tokens and top-5 log-probs, the bytes sent and the TTFT."""
        before, started = self.sent, time.perf_counter()
        first_token, parts, tokens = None, [], []
        stream = self.openai.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0.0,
            logprobs=True,
            top_logprobs=5,
            stream=True,
            extra_body={"return_tokens_as_token_ids": True},
        )
        for chunk in stream:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            if choice.delta.content is not None:
                first_token = first_token or time.perf_counter() - started
                parts.append(choice.delta.content)
            for entry in (choice.logprobs.content or []) if choice.logprobs else []:
                tokens.append([entry.token, sorted((top.token, top.logprob) for top in entry.top_logprobs)])
        ttft = first_token if first_token is not None else time.perf_counter() - started
        return "".join(parts), tokens, {"bytes": self.sent - before, "seconds": ttft}


def photo_like_jpeg(size: int) -> bytes:
    """A deterministic ``size`` x ``3/4 size`` JPEG with smooth gradients and texture (quality 90),
    about as large as a photo of that size (matplotlib's sample photos are not in .venv-vllm)."""
    import io

    import numpy as np
    from PIL import Image

    height = size * 3 // 4
    y, x = np.mgrid[0:height, 0:size].astype(np.float32)
    texture = np.random.default_rng(0).normal(0, 12, (height, size, 3))
    pixels = np.stack(
        [
            128 + 100 * np.sin(x / 97) * np.cos(y / 53),
            128 + 90 * np.cos((x + y) / 71),
            255 * y / height,
        ],
        axis=-1,
    )
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels + texture, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def conversation(image_url: str, replies: list[str]) -> list[dict[str, Any]]:
    """The image with the first question, then each reply and the next question."""
    first = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": QUESTIONS[0]}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    for reply, asked in zip(replies, QUESTIONS[1 : len(replies) + 1], strict=True):
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": asked}]
    return messages


def run(servers: list[VllmServer], image: bytes, turns: int, max_tokens: int) -> dict[str, Any]:
    clients = [Client(server) for server in servers]
    for client in clients:  # first-call costs, untimed: an image the chat never sends
        client.send(conversation(image_data_url(99, (112, 112)), []), 1)
    inline = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    handle, uploaded = clients[1].upload(image)
    urls = [inline, handle]
    replies: list[list[str]] = [[], []]
    tokens: list[list[Any]] = [[], []]
    measured: list[list[dict[str, float]]] = [[], []]
    for _ in range(turns):
        for index, client in enumerate(clients):
            text, emitted, figures = client.send(conversation(urls[index], replies[index]), max_tokens)
            replies[index].append(text)
            tokens[index].append(emitted)
            measured[index].append(figures)
    return {"upload": uploaded, "turns": measured, "replies": replies, "tokens": tokens}


def report(results: dict[str, Any], image: bytes, args: argparse.Namespace) -> None:
    print(
        f"vLLM 0.32 OpenAI server, one {args.turns}-turn chat about a {len(image):,}-byte JPEG "
        f"({args.image_size} px), {args.max_tokens} tokens per turn; model: tiny random-weight Qwen2-VL"
    )
    header = ("turn", "bytes sent: inline / handle", "ratio", "TTFT ms: inline / handle", "TTFT ratio")
    upload = results["upload"]
    rows = [
        (
            "upload",
            f"- / {upload['bytes']:,}",
            "",
            f"- / {upload['seconds'] * 1000:.0f}",
            "",
        )
    ]
    totals = [0, 0]
    for turn in range(args.turns):
        cells = [results["turns"][column][turn] for column in range(2)]
        for column in range(2):
            totals[column] += int(cells[column]["bytes"])
        ttfts = [cell["seconds"] * 1000 for cell in cells]
        rows.append(
            (
                str(turn + 1),
                f"{cells[0]['bytes']:,} / {cells[1]['bytes']:,}",
                f"{cells[0]['bytes'] / cells[1]['bytes']:.0f}x",
                f"{ttfts[0]:.0f} / {ttfts[1]:.0f}",
                f"{ttfts[0] / ttfts[1]:.2f}x",
            )
        )
    with_upload = totals[1] + upload["bytes"]
    rows.append(("all", f"{totals[0]:,} / {with_upload:,}", f"{totals[0] / with_upload:.1f}x", "", ""))
    if args.turns > 1:
        medians = [
            statistics.median(cell["seconds"] * 1000 for cell in results["turns"][c][1:]) for c in range(2)
        ]
        rows.append(
            (
                f"2-{args.turns} p50",
                "",
                "",
                f"{medians[0]:.0f} / {medians[1]:.0f}",
                f"{medians[0] / medians[1]:.2f}x",
            )
        )
    print_table(rows, header)
    print("bytes: request bodies as sent; 'all' counts the upload on the handle side")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10, choices=range(1, len(QUESTIONS) + 1))
    parser.add_argument("--image-size", type=int, default=1024, help="longest side of the photo")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    args = parser.parse_args()
    image = photo_like_jpeg(args.image_size)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        model = save_tiny_qwen2_vl(root / "model")
        servers = [
            VllmServer(model, root, name="stock"),
            VllmServer(model, root, name="handles", flags=MIDDLEWARE),
        ]
        try:
            for server in servers:
                server.start()
            for server in servers:
                server.wait_ready()
            results = run(servers, image, args.turns, args.max_tokens)
        finally:
            for server in servers:
                server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **results}, indent=2))
    report(results, image, args)
    same = results["tokens"][0] == results["tokens"][1] and results["replies"][0] == results["replies"][1]
    print(f"greedy tokens and top-5 log-probs identical in the two servers: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
