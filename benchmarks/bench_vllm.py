"""vLLM alone vs vLLM + VisionCacheECConnector, side by side, on real vLLM (CPU, tiny random weights).

Two scenarios, each run both ways in this one invocation:
- restart: an engine serves the workload, stops; a new engine serves it again (the connector with a
  disk tier kept across the restart);
- two replicas: replica A serves the workload, then replica B serves it (the connector with one
  shared redis-server; vLLM alone shares nothing, so B is a fresh engine).
Each engine is a separate process (an in-process engine: vLLM's scheduler and worker halves in one
process; the tests cover the OpenAI server path). Reported: vision-encoder calls (items encoded,
counted by wrapping the model's ``embed_multimodal``), time to first token p50/p95 of the second
engine, and the connector's per-item load cost (scheduler-side read + verification) against the
per-item encode cost (the worker's encoder phase per item). Nothing is asserted: timings on a
shared 2-core machine are noisy, so only ratios measured in one run are printed.

    .venv-vllm/bin/python benchmarks/bench_vllm.py [--vision medium|tiny]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integrations.vllm_ec.conftest import ec_config, engine_env  # noqa: E402
from tests.integrations.vllm_ec.tiny_model import save_tiny_qwen2_vl  # noqa: E402
from tests.integrations.vllm_ec.workload import BENCH  # noqa: E402
from tests.tiers.conftest import RedisProcess, free_port  # noqa: E402


def run(model: Path, workdir: Path, name: str, ec: dict[str, Any] | None) -> dict[str, Any]:
    """One engine process serving the benchmark workload; its `engine_run` report."""
    out = workdir / f"{name}.json"
    command = [
        sys.executable,
        "-m",
        "tests.integrations.vllm_ec.engine_run",
        "--model",
        str(model),
        "--out",
        str(out),
        "--workload",
        "bench",
    ]
    if ec is not None:
        command += ["--ec-config", json.dumps(ec)]
    with (workdir / f"{name}.log").open("w") as log:
        subprocess.run(
            command,
            cwd=ROOT,
            env=engine_env(workdir / f"{name}-encoder.log"),
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def row(label: str, alone: dict[str, Any], connected: dict[str, Any]) -> list[str]:
    a, c = alone["workloads"]["bench"], connected["workloads"]["bench"]
    ttft_a, ttft_c = a["first_token_seconds"], c["first_token_seconds"]
    p50 = statistics.median(ttft_a), statistics.median(ttft_c)
    p95 = percentile(ttft_a, 0.95), percentile(ttft_c, 0.95)
    same = "yes" if a["outputs"] == c["outputs"] else "NO"
    return [
        f"{label}: items encoded by the second engine   {a['encoded']:>8} {c['encoded']:>10}",
        f"{label}: TTFT p50 of the second engine (ms)   {1e3 * p50[0]:>8.1f} {1e3 * p50[1]:>10.1f}"
        f"   ({p50[0] / p50[1]:.2f}x)",
        f"{label}: TTFT p95 of the second engine (ms)   {1e3 * p95[0]:>8.1f} {1e3 * p95[1]:>10.1f}"
        f"   ({p95[0] / p95[1]:.2f}x)",
        f"{label}: identical tokens and top-5 logprobs  {same:>19}",
    ]


def costs(first: dict[str, Any], second: dict[str, Any]) -> str:
    encoded = first["connector"].get("encoded_items", 0)
    encode = first["connector"].get("encode_seconds", 0.0) / encoded if encoded else float("nan")
    hits = second["connector"].get("hits", 0)
    load = second["connector"].get("load_seconds", 0.0) / hits if hits else float("nan")
    return f"per item: load {1e3 * load:.2f} ms vs encode {1e3 * encode:.2f} ms ({encode / load:.1f}x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vision", choices=["tiny", "medium"], default="medium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as temporary:
        workdir = Path(temporary)
        model = save_tiny_qwen2_vl(workdir / "model", vision=args.vision, max_pixels=448 * 448)
        alone_first = run(model, workdir, "alone-1", None)
        alone_second = run(model, workdir, "alone-2", None)
        disk = ec_config(disk_dir=str(workdir / "disk"))
        restart_first = run(model, workdir, "restart-1", disk)
        restart_second = run(model, workdir, "restart-2", disk)
        redis = RedisProcess(free_port())
        redis.start()
        try:
            shared = ec_config(redis_url=redis.url)
            replica_a = run(model, workdir, "replica-a", shared)
            replica_b = run(model, workdir, "replica-b", shared)
        finally:
            redis.stop()

    print(f"$ python benchmarks/bench_vllm.py --vision {args.vision}")
    print(
        f"vLLM 0.32.0 (CPU), Qwen2-VL with a {args.vision} random-weight vision tower, bf16; workload: "
        f"{BENCH.users} users x {BENCH.turns} turns, {BENCH.images_sent} images sent, {BENCH.distinct} "
        f"distinct, {BENCH.image_size[0]}x{BENCH.image_size[1]}"
    )
    print(
        f"first engine encoded: alone {alone_first['workloads']['bench']['encoded']}, "
        f"connector {restart_first['workloads']['bench']['encoded']} (restart) / "
        f"{replica_a['workloads']['bench']['encoded']} (replica A)"
    )
    print(f"{'':48}{'vLLM alone':>10} {'+ connector':>11}")
    for line in row("restart ", alone_second, restart_second):
        print(line)
    for line in row("replicas", alone_second, replica_b):
        print(line)
    print(f"restart  (disk tier):  {costs(restart_first, restart_second)}")
    print(f"replicas (redis tier): {costs(replica_a, replica_b)}")


if __name__ == "__main__":
    main()
