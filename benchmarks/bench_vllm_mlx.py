"""vllm-mlx's OpenAI server, stock vs visioncache, side by side on a multi-user image chat.

    python benchmarks/bench_vllm_mlx.py [--users 3] [--turns 4] [--image-size 448] [--max-tokens 8]
                                        [--family qwen2_vl | --model DIR] [--system-repeat 1]
                                        [--json PATH]
    python benchmarks/bench_vllm_mlx.py --long [--chats 4] [--turns 6] [--images 3]
                                        [--question-words 300] [--long-system-repeat 40]
                                        [--chunked N]

Both servers are vllm-mlx 0.6.0's real server (``--continuous-batching --mllm``) in their own
process on loopback, serving the same model (default: a tiny random-weight checkpoint of
``--family`` built here, Qwen2-VL unless told; ``--model`` for a real mlx-vlm checkpoint of a
family visioncache serves). The workload is the one of
``visioncache bench``: users in multi-turn chats that re-send every image, share photos, and ask
several questions about one image. Each request is streamed to the stock server, then the same
request to the visioncache server, one at a time, so machine noise falls on both alike.

``--chunked [N]`` serves both with ``--chunked-prefill-tokens N`` (256 if N is left out) and
also prints turn >= 2's prefill tokens and TTFT p50, stock vs visioncache, with their ratios.

Per turn it prints, for each server: images through the vision tower (counted inside the server),
prefill tokens computed (prompt tokens minus the KV tokens the engine reused, from its
``/v1/cache/stats``), and time to first token p50 / p95 (first streamed token, client side).
It exits 1 if the two servers' greedy tokens or top-5 log-probs differ anywhere.

``--long`` runs long concurrent chats instead, on stock, serve-mlx, and serve-mlx restarted on its
warm disk tier (`_long_chats`: KV prefixes kept in the tiers, #32); with ``--chunked N`` all three
run with ``--chunked-prefill-tokens N``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support: the server harness

from openai import OpenAI

import _long_chats as long_chats
from tests.support.mlx_model_dir import FAMILIES, save_model_dir
from tests.support.vllm_mlx_server import ServerProcess
from visioncache.bench.workload import ANSWER, Request, Workload, build_workload, sample_images

from _timing import print_table

SYSTEM = "You are a helpful assistant. Look at the images the user sends and answer in a few words."


def messages_for(request: Request, workload: Workload, system_repeat: int = 1) -> list[dict[str, Any]]:
    """The OpenAI messages of a request: the conversation so far, images re-sent, canned answers."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": " ".join([SYSTEM] * system_repeat)}]
    for index, turn in enumerate(request.turns):
        parts: list[dict[str, Any]] = [
            {"type": "image_url", "image_url": {"url": workload.images[image]}}
            for image in turn.image_indexes
        ]
        messages.append({"role": "user", "content": [*parts, {"type": "text", "text": turn.question}]})
        if index < len(request.turns) - 1:
            messages.append({"role": "assistant", "content": ANSWER})
    return messages


def send(
    server: ServerProcess, client: OpenAI, messages: list[dict[str, Any]], max_tokens: int
) -> dict[str, float]:
    """Stream one request; its TTFT, prompt tokens, prefill tokens computed and tower images."""
    towers, saved = len(server.records("tower")), long_chats.saved(server)
    streamed = long_chats.stream(client, messages, max_tokens)
    reused = long_chats.saved(server) - saved
    images = sum(entry["images"] for entry in server.records("tower")[towers:])
    prompt_tokens, ttft = int(streamed["prompt"]), streamed["ttft"]
    return {"ttft": ttft, "prompt_tokens": prompt_tokens, "prefill": prompt_tokens - reused, "tower": images}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=3)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=448, help="longest side of each image")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument(
        "--chunked",
        type=int,
        nargs="?",
        const=256,
        default=0,
        metavar="N",
        help="both servers with --chunked-prefill-tokens N (default N: 256)",
    )
    parser.add_argument(
        "--family", default="qwen2_vl", help="the tiny random-weight checkpoint's family (e.g. gemma4)"
    )
    parser.add_argument("--model", help="an mlx-vlm model directory (default: the tiny --family one)")
    parser.add_argument(
        "--system-repeat",
        type=int,
        default=1,
        help="the system prompt this many times (vllm-mlx stores no KV prefix under 128 tokens: "
        "a tiny model with few tokens per image, e.g. gemma4's 16, needs a longer one)",
    )
    parser.add_argument("--json", metavar="PATH", help="write every per-request measurement as JSON")
    group = parser.add_argument_group("--long", "long concurrent chats, restarted on a warm disk tier")
    group.add_argument("--long", action="store_true", help="run the long chats (benchmarks/_long_chats.py)")
    group.add_argument("--chats", type=int, default=4)
    group.add_argument("--images", type=int, default=3, help="images per chat (2 to 4), one per turn")
    group.add_argument("--question-words", type=int, default=300)
    group.add_argument("--long-system-repeat", type=int, default=40)
    args = parser.parse_args()
    if args.long:  # --turns, --image-size, --max-tokens, --family and --model apply there too
        return long_chats.long_main(args, model_directory, warm_up)
    workload = build_workload(args.users, args.turns, args.image_size)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        if args.model is None and args.family not in FAMILIES:
            parser.error(f"--family must be one of {', '.join(FAMILIES)}")
        model_dir = model_directory(args.model, args.family, root)
        flags = ("--chunked-prefill-tokens", str(args.chunked)) if args.chunked else ()
        servers = {
            name: ServerProcess(name, model_dir, root / name, *flags) for name in ("stock", "visioncache")
        }
        try:
            for server in servers.values():
                server.start()
                warm_up(server, args.image_size)
            results = run(servers, workload, args.max_tokens, args.system_repeat)
            same = servers["stock"].records("token") == servers["visioncache"].records("token")
            stats = servers["visioncache"].get_json("/v1/cache/stats")["engine_cache"]
        finally:
            for server in servers.values():
                server.stop()
    report(results, workload, args)
    if args.chunked:
        report_later_turns(results, args.chunked)
    vision = stats["vision_embedding_cache"]
    print(
        f"visioncache, warm-up included: {vision['vision_tower_calls']} tower calls for "
        f"{vision['images_encoded']} images; "
        f"embedding hits {vision['embedding_cache_hits']}; KV tokens reused {vision['kv_tokens_reused']} "
        f"on {vision['kv_prefix_hits']} image requests"
    )
    print(f"greedy tokens and top-5 log-probs identical to stock: {'yes' if same else 'NO'}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "results": results, "stats": stats}, indent=2)
        )
    return 0 if same else 1


def model_directory(model: str | None, family: str, root: Path) -> Path:
    """``--model``, or a tiny random-weight checkpoint of ``family`` saved under ``root``."""
    if model is not None:
        return Path(model)
    return save_model_dir(root / "model", family)


def warm_up(server: ServerProcess, image_size: int) -> None:
    """One untimed image request (an image the workload never sends): the first tower call and
    prefill pay one-time allocation costs in both servers alike."""
    image = sample_images(image_size, generated_images=1, seed=99)[-1][1]
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "describe"}]
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    client.chat.completions.create(
        model="model", messages=[{"role": "user", "content": content}], max_tokens=1, temperature=0.0
    )


def run(
    servers: dict[str, ServerProcess], workload: Workload, max_tokens: int, system_repeat: int
) -> dict[str, list[dict[str, Any]]]:
    clients = {
        name: OpenAI(base_url=server.base_url + "/v1", api_key="unused") for name, server in servers.items()
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for request in workload.requests:
        messages = messages_for(request, workload, system_repeat)
        for name, server in servers.items():
            measured = send(server, clients[name], messages, max_tokens)
            results[name].append({"user": request.user, "turn": len(request.turns), **measured})
    return results


def report(results: dict[str, list[dict[str, Any]]], workload: Workload, args: argparse.Namespace) -> None:
    print(
        f"vllm-mlx 0.6.0 server, {args.users} users x {args.turns} turns, images {args.image_size} px, "
        f"{workload.images_sent} images sent ({workload.distinct_images_sent} distinct); "
        f"{f'--chunked-prefill-tokens {args.chunked}; ' if args.chunked else ''}"
        f"model: {args.model or f'tiny random-weight {args.family}'}"
    )
    header = ("turn", "tower images", "prefill tokens", "TTFT p50 ms", "TTFT p95 ms", "TTFT p50 ratio")
    rows = []
    for turn in range(1, args.turns + 1):
        cells: dict[str, dict[str, Any]] = {}
        for name, measured in results.items():
            of_turn = [entry for entry in measured if entry["turn"] == turn]
            ttfts = [entry["ttft"] * 1000 for entry in of_turn]
            cells[name] = {
                "tower": sum(entry["tower"] for entry in of_turn),
                "prefill": sum(entry["prefill"] for entry in of_turn),
                "p50": statistics.median(ttfts),
                "p95": percentile(ttfts, 0.95),
            }
        stock, ours = cells["stock"], cells["visioncache"]
        rows.append(
            (
                str(turn),
                f"{stock['tower']} -> {ours['tower']}",
                f"{stock['prefill']} -> {ours['prefill']}",
                f"{stock['p50']:.0f} -> {ours['p50']:.0f}",
                f"{stock['p95']:.0f} -> {ours['p95']:.0f}",
                f"{stock['p50'] / max(ours['p50'], 1e-9):.2f}x",
            )
        )
    totals = {name: (sum(e["tower"] for e in m), sum(e["prefill"] for e in m)) for name, m in results.items()}
    rows.append(
        (
            "all",
            f"{totals['stock'][0]} -> {totals['visioncache'][0]}",
            f"{totals['stock'][1]} -> {totals['visioncache'][1]}",
            "",
            "",
            "",
        )
    )
    print("stock -> visioncache")
    print_table(rows, header)


def report_later_turns(results: dict[str, list[dict[str, Any]]], chunk: int) -> None:
    """Turn >= 2 of every chat, stock vs visioncache (both with ``--chunked-prefill-tokens``)."""
    later = {name: [entry for entry in measured if entry["turn"] >= 2] for name, measured in results.items()}
    prefill = {name: sum(entry["prefill"] for entry in of_server) for name, of_server in later.items()}
    ttft = {name: statistics.median(entry["ttft"] * 1000 for entry in m) for name, m in later.items()}
    print(
        f"turn >= 2 with --chunked-prefill-tokens {chunk} ({len(later['stock'])} requests each): "
        f"prefill tokens {prefill['stock']} -> {prefill['visioncache']} "
        f"({prefill['stock'] / max(prefill['visioncache'], 1):.2f}x fewer), "
        f"TTFT p50 {ttft['stock']:.0f} -> {ttft['visioncache']:.0f} ms "
        f"({ttft['stock'] / max(ttft['visioncache'], 1e-9):.2f}x)"
    )


if __name__ == "__main__":
    sys.exit(main())
