"""Hit latency per tier for a 3 MB and a 20 MB value, deserialisation included, side by side.

Tiers: the in-memory Store (what the cache holds above the chain), DiskTier on /dev/shm and on
the local disk, and RedisTier on a redis-server this script starts on a free loopback port.
Each number is the median of ``--repeats`` one-key hits through `TierChain.load_many` (memory:
`Store.lookup`).
Beside them, what a miss costs instead on this machine: the 3 MB value is a 2B-class tower's
embedding of one 1024x768 image (999 x 1536 bf16), recomputed by the vision encoder (tiny tower;
with ``--full-tower`` also the 2B-class one, ~20-45 s on a CPU); the 20 MB value is about that
image's pixel values (18.8 MB fp32), recomputed by JPEG decode + the image processor.

    python benchmarks/bench_tiers.py [--repeats 20] [--full-tower]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).parent))

from visioncache.store.store import Store
from visioncache.tiers.base import Tier
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.redis import RedisTier

VALUES = {
    "3 MB float16": np.random.default_rng(0).standard_normal(1536 * 1024).astype(np.float16),
    "20 MB float32": np.random.default_rng(1).standard_normal(5 * 2**20).astype(np.float32),
}
KEY = "0123456789abcdef/embedding/" + "ab" * 32


def median_ms(call: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
        assert result is not None
    return statistics.median(times) * 1000


def start_redis() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("redis-server is not on PATH")
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(500):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.01)
    client.close()
    return process, url


def recompute_costs_ms(full_tower: bool) -> dict[str, dict[str, float]]:
    """Milliseconds to recompute each value on a miss: encode (3 MB column), preprocess (20 MB)."""
    try:
        import torch

        from bench_gpu import build_tower, image_processor, median_seconds, photo_jpegs
    except ImportError:  # without the hf extra there is nothing to compare with
        return {}
    jpeg = photo_jpegs(1)
    processor = image_processor()

    def preprocess() -> Any:
        from io import BytesIO

        from PIL import Image

        return processor(images=[Image.open(BytesIO(jpeg[0])).convert("RGB")], return_tensors="pt")

    batch = preprocess()
    labels = list(VALUES)
    rows = {"recompute: decode + preprocess": {labels[1]: median_seconds(preprocess, 3, lambda: None) * 1e3}}
    towers = [("tiny", torch.float32)] + ([("full", torch.bfloat16)] if full_tower else [])
    for size, dtype in towers:
        tower = build_tower("qwen2_vl", size, dtype, torch.device("cpu"))
        encode = partial(tower, batch["pixel_values"].to(dtype), grid_thw=batch["image_grid_thw"])
        with torch.inference_mode():
            seconds = median_seconds(encode, 3 if size == "tiny" else 1, lambda: None)
        rows[f"recompute: encode, {size} tower"] = {labels[0]: seconds * 1e3}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--full-tower", action="store_true", help="also time the 2B-class tower (slow)")
    args = parser.parse_args()
    redis_process, url = start_redis()
    shm = tempfile.mkdtemp(dir="/dev/shm", prefix="visioncache-bench-")
    disk = tempfile.mkdtemp(prefix="visioncache-bench-")
    tiers: dict[str, Tier] = {
        "disk (/dev/shm)": DiskTier(shm, 2**30, name="shm"),
        "disk (local)": DiskTier(disk, 2**30, name="disk"),
        "redis (loopback)": RedisTier(url, socket_timeout=5.0),
    }
    rows: dict[str, dict[str, float]] = {"memory Store": {}} | {name: {} for name in tiers}
    try:
        for label, value in VALUES.items():
            store = Store(max_bytes=2**30)
            store.put(KEY, value)
            rows["memory Store"][label] = median_ms(lambda store=store: store.lookup(KEY), args.repeats)
            for name, tier in tiers.items():
                chain = TierChain([tier])
                chain.save(KEY, value)
                (loaded,) = chain.load_many([KEY])
                assert loaded.dtype == value.dtype and np.array_equal(loaded, value)
                rows[name][label] = median_ms(lambda chain=chain: chain.load_many([KEY]), args.repeats)
    finally:
        for tier in tiers.values():
            tier.close()
        redis_process.kill()
        redis_process.wait()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)

    rows |= recompute_costs_ms(args.full_tower)
    print("$ python " + " ".join(sys.argv))
    print("hit latency, median ms (tiers: read + verify digest + deserialise); ratio vs /dev/shm")
    header = f"{'tier':<32}" + "".join(f"{label:>26}" for label in VALUES)
    print(header)
    base = rows["disk (/dev/shm)"]
    for name, row in rows.items():
        cells = "".join(
            f"{row[label]:>13,.3f} ms ({row[label] / base[label]:7,.1f}x)" if label in row else " " * 26
            for label in VALUES
        )
        print(f"{name:<32}{cells}")


if __name__ == "__main__":
    main()
