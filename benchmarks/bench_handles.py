"""Image handles in serve-mlx: a multi-turn image chat that uploads once and then sends the handle,
against the same chat re-sending the image on every turn, side by side.

    python benchmarks/bench_handles.py [--turns 10] [--image-size 1024] [--max-tokens 8]
                                       [--model DIR] [--json PATH]

Three servers, each vllm-mlx 0.6.0's real server in its own process on loopback, serving the same
model (default: a tiny random-weight Qwen2-VL built here; ``--model`` for a real mlx-vlm Qwen2-VL /
Qwen2.5-VL checkpoint): stock vllm-mlx and visioncache, both re-sent the image (a JPEG photo as a
base64 data URL in the first user message of the history, as OpenAI clients send it), and a
second visioncache server that gets the image once (``POST /v1/visioncache/images``, raw bytes)
and then ``visioncache://<handle>``. Each turn is streamed to the three in turn, one request at a
time, so machine noise falls on all alike. Each server first answers one untimed request about
another image (first-call costs), as in ``benchmarks/bench_vllm_mlx.py``.

Per turn it prints the request bytes each client sent (bodies as they crossed the network, from
the ``openai`` client's own HTTP client) and the time to first token (first streamed token,
client side), with their ratios re-sent / handle. The upload is its own row. It exits 1 if the
three servers' greedy tokens or top-5 log-probs differ anywhere.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support: the server harness

from openai import DefaultHttpxClient, OpenAI

from bench_vllm_mlx import model_directory, warm_up
from tests.support.vllm_mlx_server import ServerProcess
from visioncache.bench.workload import sample_images

from _timing import print_table

SYSTEM = "You are a helpful assistant. Look at the image the user sends and answer in a few words."
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
COLUMNS = ("stock, re-sent", "visioncache, re-sent", "visioncache, handle")


class Client:
    """An ``openai`` client on one server whose HTTP client counts the request bytes it sends."""

    def __init__(self, server: ServerProcess) -> None:
        self.sent = 0
        http = DefaultHttpxClient(event_hooks={"request": [self._count]}, timeout=600)
        self.openai = OpenAI(base_url=server.base_url + "/v1", api_key="unused", http_client=http)

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

    def send(self, messages: list[dict[str, Any]], max_tokens: int) -> tuple[str, dict[str, float]]:
        """Stream one turn: the reply, the bytes sent and the time to first token."""
        before, started = self.sent, time.perf_counter()
        first_token, parts = None, []
        stream = self.openai.chat.completions.create(
            model="model",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content is not None:
                first_token = first_token or time.perf_counter() - started
                parts.append(chunk.choices[0].delta.content)
        ttft = first_token if first_token is not None else time.perf_counter() - started
        return "".join(parts), {"bytes": self.sent - before, "seconds": ttft}


def conversation(image_url: str, replies: list[str], question: str) -> list[dict[str, Any]]:
    """System, then the image with the first question, then each reply and the next question."""
    first = [
        {"type": "image_url", "image_url": {"url": image_url}},
        {"type": "text", "text": QUESTIONS[0]},
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": first},
    ]
    for reply, asked in zip(replies, QUESTIONS[1 : len(replies) + 1], strict=True):
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": asked}]
    return messages


def run(servers: list[ServerProcess], image: bytes, turns: int, max_tokens: int) -> dict[str, Any]:
    clients = [Client(server) for server in servers]
    inline = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    handle, uploaded = clients[2].upload(image)
    urls = [inline, inline, handle]
    replies: list[list[str]] = [[], [], []]
    measured: list[list[dict[str, float]]] = [[], [], []]
    for turn in range(turns):
        for index, client in enumerate(clients):
            text, figures = client.send(
                conversation(urls[index], replies[index], QUESTIONS[turn]), max_tokens
            )
            replies[index].append(text)
            measured[index].append(figures)
    return {"upload": uploaded, "turns": measured, "replies": replies}


def token_records(server: ServerProcess) -> list[tuple[Any, Any]]:
    """Emitted tokens and top log-probs in order, the warm-up's left out (request keys differ:
    handle vs image)."""
    entries = server.records("token")[1:]  # the warm-up: one token
    return [(entry["token"], entry.get("top")) for entry in entries]


def report(results: dict[str, Any], image: bytes, args: argparse.Namespace) -> None:
    print(
        f"vllm-mlx 0.6.0 server, one {args.turns}-turn chat about a {len(image):,}-byte JPEG "
        f"({args.image_size} px), {args.max_tokens} tokens per turn; model: "
        f"{args.model or 'tiny random-weight Qwen2-VL'}"
    )
    header = (
        "turn",
        "bytes sent: re-sent / handle",
        "ratio",
        "TTFT ms: " + " / ".join(COLUMNS),
        "TTFT ratio re-sent / handle",
    )
    upload = results["upload"]
    rows = [("upload", f"- / {upload['bytes']:,}", "", f"- / - / {upload['seconds'] * 1000:.0f}", "")]
    totals = [0, 0, 0]
    for turn in range(args.turns):
        cells = [results["turns"][column][turn] for column in range(3)]
        for column in range(3):
            totals[column] += int(cells[column]["bytes"])
        ttfts = [cell["seconds"] * 1000 for cell in cells]
        rows.append(
            (
                str(turn + 1),
                f"{cells[1]['bytes']:,} / {cells[2]['bytes']:,}",
                f"{cells[1]['bytes'] / cells[2]['bytes']:.0f}x",
                " / ".join(f"{ttft:.0f}" for ttft in ttfts),
                f"{ttfts[1] / ttfts[2]:.2f}x",
            )
        )
    with_upload = totals[2] + upload["bytes"]
    rows.append(("all", f"{totals[1]:,} / {with_upload:,}", f"{totals[1] / with_upload:.1f}x", "", ""))
    if args.turns > 1:  # the turns after the first: no encoding anywhere but stock
        medians = [
            statistics.median(cell["seconds"] * 1000 for cell in results["turns"][column][1:])
            for column in range(3)
        ]
        later = f"2-{args.turns} p50"
        rows.append(
            (later, "", "", " / ".join(f"{m:.0f}" for m in medians), f"{medians[1] / medians[2]:.2f}x")
        )
    print_table(rows, header)
    print("bytes: request bodies as sent; 'all' counts the upload on the handle side")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10, choices=range(1, len(QUESTIONS) + 1))
    parser.add_argument("--image-size", type=int, default=1024, help="longest side of the photo")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--model", help="an mlx-vlm Qwen2-VL / Qwen2.5-VL directory (default: tiny random)")
    parser.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    args = parser.parse_args()
    photo = sample_images(args.image_size, generated_images=0)[0][1]
    image = base64.b64decode(photo.split(",", 1)[1])
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        model_dir = model_directory(args.model, "qwen2_vl", root)
        engines = ("stock", "visioncache", "visioncache")
        servers = [ServerProcess(name, model_dir, root / f"{index}") for index, name in enumerate(engines)]
        try:
            for server in servers:
                server.start()
                warm_up(server, args.image_size)  # an image the chat never sends, untimed
            results = run(servers, image, args.turns, args.max_tokens)
            records = [token_records(server) for server in servers]
        finally:
            for server in servers:
                server.stop()
    report(results, image, args)
    same = records[0] == records[1] == records[2] and len(set(map(tuple, results["replies"]))) == 1
    print(f"greedy tokens and top-5 log-probs identical in the three servers: {'yes' if same else 'NO'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **results}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
