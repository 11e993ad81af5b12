"""``bench_vllm_mlx.py --long``: long image chats, stock vs serve-mlx vs serve-mlx restarted (#32).

``--chats`` chats run concurrently (one request per chat per turn, sent together), each with a long
system prompt (``--system-repeat``), an image in each of its first ``--images`` turns (2 to 4
distinct images per chat) and a ``--question-words``-word question every turn, for ``--turns``
turns, the whole history re-sent (canned answers, so every server gets the same requests). Three
servers in turn, each on its own: stock vllm-mlx; ``visioncache serve-mlx`` with a disk tier; and
``serve-mlx`` restarted before every turn on a disk tier of its own, with nothing else kept (a
fresh HOME each time): every request it serves is the first request of a running chat after a
restart, the tier holding only what earlier turns' processes wrote. Per turn: time to first
token (p50, max over the chats), prefill tokens computed (prompt tokens minus the KV tokens the
engine reused), images through the tower; and the KV bytes on disk after each serve-mlx run.
With ``--chunked N`` all three servers run with ``--chunked-prefill-tokens N``.
Exits 1 if the servers' greedy tokens or top-5 log-probs differ for any request.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from openai import OpenAI

from tests.support.vllm_mlx_server import ServerProcess
from visioncache.bench.workload import ANSWER, sample_images

from _timing import print_table

SYSTEM = "You are a helpful assistant. Look at the images the user sends and answer in a few words."
WORDS = ("light", "shadow", "colour", "edge", "shape", "texture", "corner", "middle", "pattern", "tone")


def chat_messages(chat: int, turn: int, images: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Chat ``chat``'s request at ``turn`` (1-based): its whole history, canned answers."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": " ".join([SYSTEM] * args.long_system_repeat)}
    ]
    for index in range(turn):
        words = [WORDS[(chat + index + n) % len(WORDS)] for n in range(args.question_words)]
        parts: list[dict[str, Any]] = []
        if index < args.images:
            parts.append({"type": "image_url", "image_url": {"url": images[chat * args.images + index]}})
        parts.append({"type": "text", "text": f"chat {chat} turn {index}: " + " ".join(words) + "?"})
        messages.append({"role": "user", "content": parts})
        if index < turn - 1:
            messages.append({"role": "assistant", "content": ANSWER})
    return messages


def stream(client: OpenAI, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, float]:
    started, first, prompt = time.perf_counter(), None, 0
    response = client.chat.completions.create(
        model="model",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in response:
        if first is None and chunk.choices and chunk.choices[0].delta.content is not None:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            prompt = chunk.usage.prompt_tokens
    return {"ttft": first if first is not None else time.perf_counter() - started, "prompt": prompt}


def saved(server: ServerProcess) -> int:
    value: int = server.get_json("/v1/cache/stats")["engine_cache"]["prefix_cache"]["tokens_saved"]
    return value


def run_turn(server: ServerProcess, turn: int, images: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One turn of every chat, sent together: TTFTs, prompt and prefill tokens, tower images."""
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=600)
    towers, before = len(server.records("tower")), saved(server)
    with ThreadPoolExecutor(args.chats) as pool:
        measured = list(
            pool.map(
                lambda chat: stream(client, chat_messages(chat, turn, images, args), args.max_tokens),
                range(args.chats),
            )
        )
    prompt = sum(entry["prompt"] for entry in measured)
    return {
        "turn": turn,
        "ttfts": [entry["ttft"] for entry in measured],
        "prompt": prompt,
        "prefill": prompt - (saved(server) - before),
        "tower": sum(entry["images"] for entry in server.records("tower")[towers:]),
    }


def run_server(
    servers: Callable[[int], ServerProcess], images: list[str], args: argparse.Namespace, warm_up: Any
) -> tuple[list[dict[str, Any]], dict[str, list[Any]], dict[str, Any]]:
    """Every turn's measurements, the tokens recorded by request, and the engine's last stats.

    ``servers(turn)`` is the server for that turn: one process for every turn, or a new one per
    turn (a restart before every turn)."""
    turns: list[dict[str, Any]] = []
    tokens: dict[str, list[Any]] = {}
    stats: dict[str, Any] = {}
    server: ServerProcess | None = None
    try:
        for turn in range(1, args.turns + 1):
            if servers(turn) is not server:
                if server is not None:
                    stats, server = finish(server, tokens), None
                server = servers(turn).start()
                warm_up(server, args.image_size)
            turns.append(run_turn(server, turn, images, args))
        assert server is not None
        stats, server = finish(server, tokens), None
    finally:
        if server is not None:
            server.stop()
    return turns, tokens, stats


def finish(server: ServerProcess, tokens: dict[str, list[Any]]) -> dict[str, Any]:
    """Stop ``server`` after adding its recorded tokens to ``tokens``; its engine stats."""
    stats: dict[str, Any] = server.get_json("/v1/cache/stats")["engine_cache"]
    mine: dict[str, list[Any]] = {}
    for entry in server.records("token"):
        mine.setdefault(entry["key"], []).append([entry["token"], entry.get("top")])
    for key, value in mine.items():  # each restarted process serves the same warm-up request
        tokens.setdefault(key, value)
    server.stop()
    return stats


def long_main(args: argparse.Namespace, model_directory: Any, warm_up: Any) -> int:
    if not 2 <= args.images <= 4 or args.images > args.turns:
        raise SystemExit("--images: 2 to 4, at most --turns")
    pictures = [url for _, url in sample_images(args.image_size, generated_images=args.chats * args.images)]
    images = pictures[-args.chats * args.images :]
    results, tokens, stats = {}, {}, {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        model_dir = model_directory(args.model, args.family, root)
        chunked = ["--chunked-prefill-tokens", str(args.chunked)] if args.chunked else []
        disk = [*chunked, "--vision-cache-disk-dir", str(root / "tier")]
        restart_disk = ["--vision-cache-disk-dir", str(root / "restart-tier")]
        stock = ServerProcess("stock", model_dir, root / "stock", *chunked)
        first = ServerProcess("visioncache", model_dir, root / "first", *disk)
        restarted = [  # a fresh HOME each (nothing kept but the tier), a tier of their own
            ServerProcess("visioncache", model_dir, root / f"restarted-{turn}", *chunked, *restart_disk)
            for turn in range(1, args.turns + 1)
        ]
        servers: dict[str, Callable[[int], ServerProcess]] = {
            "stock": lambda turn: stock,
            "serve-mlx": lambda turn: first,
            "restarted": lambda turn: restarted[turn - 1],
        }
        for name, server in servers.items():
            results[name], tokens[name], stats[name] = run_server(server, images, args, warm_up)
    same = tokens["stock"] == tokens["serve-mlx"] == tokens["restarted"]
    report(results, stats, args, len(images))
    print(f"greedy tokens and top-5 log-probs identical to stock: {'yes' if same else 'NO'}")
    return 0 if same else 1


def report(
    results: dict[str, list[dict[str, Any]]], stats: dict[str, Any], args: argparse.Namespace, images: int
) -> None:
    longest = max(turn["prompt"] for turn in results["stock"]) // args.chats
    print(
        f"vllm-mlx 0.6.0 server, {args.chats} concurrent chats x {args.turns} turns, {args.images} images "
        f"each ({images} distinct, {args.image_size} px), prompts up to ~{longest} tokens; "
        f"{f'--chunked-prefill-tokens {args.chunked} on all three; ' if args.chunked else ''}"
        f"model: {args.model or f'tiny random-weight {args.family}'}"
    )
    header = ("turn", "prompt tokens", "prefill tokens", "tower images", "TTFT p50 ms", "TTFT max ms")
    rows = []
    names = ("stock", "serve-mlx", "restarted")
    for index in range(args.turns):
        cells = [results[name][index] for name in names]
        rows.append(
            (
                str(index + 1),
                str(cells[0]["prompt"]),
                " / ".join(str(cell["prefill"]) for cell in cells),
                " / ".join(str(cell["tower"]) for cell in cells),
                " / ".join(f"{statistics.median(cell['ttfts']) * 1000:.0f}" for cell in cells),
                " / ".join(f"{max(cell['ttfts']) * 1000:.0f}" for cell in cells),
            )
        )
    totals = [sum(turn["prefill"] for turn in results[name]) for name in names]
    rows.append(("all", "", " / ".join(map(str, totals)), "", "", ""))
    print("stock / serve-mlx / serve-mlx restarted before every turn on its disk tier")
    print_table(rows, header)
    print(later_turns(results, names))
    for name in names[1:]:
        vision = stats[name]["vision_embedding_cache"]
        print(
            f"{name}: KV bytes on disk {vision['kv_tier_bytes']} (budget {vision['kv_tier_max_bytes']}), "
            f"KV prefixes written {vision['kv_tier_writes']}, restored {vision['kv_tier_restores']} "
            f"({vision['kv_tier_tokens_restored']} tokens), superseded {vision['kv_tier_superseded']}"
        )


def later_turns(results: dict[str, list[dict[str, Any]]], names: tuple[str, ...]) -> str:
    """Turn >= 2's TTFT p50 over every request, each server's ratio to stock, and the largest
    per-turn ratio (the turn whose new tail, or new image, costs most against stock's)."""
    later = {name: [ttft for turn in results[name][1:] for ttft in turn["ttfts"]] for name in names}
    stock = statistics.median(later["stock"])
    parts = [f"stock {stock * 1000:.0f} ms"]
    for name in names[1:]:
        p50 = statistics.median(later[name])
        worst = max(
            statistics.median(mine["ttfts"]) / statistics.median(theirs["ttfts"])
            for mine, theirs in zip(results[name][1:], results["stock"][1:], strict=True)
        )
        parts.append(f"{name} {p50 * 1000:.0f} ms ({p50 / stock:.3f}x; worst turn {worst:.3f}x)")
    return f"turn >= 2, TTFT p50 over {len(later['stock'])} requests each: " + ", ".join(parts)
