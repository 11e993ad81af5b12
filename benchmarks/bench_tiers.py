"""Hit latency per tier for a 3 MB and a 20 MB value, deserialisation included, side by side.

Tiers: the in-memory Store (what the cache holds above the chain), DiskTier on /dev/shm and on
the local disk, and RedisTier on a redis-server this script starts on a free loopback port.
Each number is the median of ``--repeats`` hits through `TierChain.load` (memory: `Store.get`).

    python benchmarks/bench_tiers.py [--repeats 20]
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
from typing import Any

import numpy as np
import redis

from visioncache.store import Store
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
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
            rows["memory Store"][label] = median_ms(lambda store=store: store.get(KEY), args.repeats)
            for name, tier in tiers.items():
                chain = TierChain([tier])
                chain.save(KEY, value)
                loaded = chain.load(KEY)
                assert loaded.dtype == value.dtype and np.array_equal(loaded, value)
                rows[name][label] = median_ms(lambda chain=chain: chain.load(KEY), args.repeats)
    finally:
        for tier in tiers.values():
            tier.close()
        redis_process.kill()
        redis_process.wait()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)

    print(f"$ python benchmarks/bench_tiers.py --repeats {args.repeats}")
    print("hit latency, median ms (tiers: read + verify digest + deserialise); ratio vs /dev/shm")
    header = f"{'tier':<18}" + "".join(f"{label:>24}" for label in VALUES)
    print(header)
    base = rows["disk (/dev/shm)"]
    for name, row in rows.items():
        cells = "".join(f"{row[label]:>12.3f} ms ({row[label] / base[label]:5.2f}x)" for label in VALUES)
        print(f"{name:<18}{cells}")


if __name__ == "__main__":
    main()
