"""The per-image embedding level under load: four measurements, side by side in one run.

1. hit throughput on hot keys with 1, 2 and 8 threads (target: 8 threads >= 0.8x one thread);
2. 16 threads asking for one new image, 200 ms encode_fn: exactly 1 encode, wall ~ one encode;
3. hit latency with 10^2, 10^4 and 10^5 entries (target: largest <= 1.2x smallest);
4. encode_batch of 32 requests x 4 images from 40 distinct, half cached: one encode_fn call with
   exactly the distinct missing images.

usage: python benchmarks/bench_embeddings.py [--seconds S]
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np
from blake3 import blake3
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from visioncache import VisionEmbeddingCache, compute_image_hash

from _timing import interleaved_medians, print_table

EMBEDDING = np.zeros((999, 1536), dtype=np.float16)  # a 2B-class tower's output for one image


def small_jpeg(seed: int, size: int = 64) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def throughput(
    cache: VisionEmbeddingCache | None, images: list[bytes], threads: int, seconds: float
) -> float:
    """Total hits per second over ``threads`` threads looking up hot keys (no cache: blake3 alone)."""
    counts = [0] * threads
    stop = threading.Event()
    barrier = threading.Barrier(threads + 1)

    def work(index: int) -> None:
        barrier.wait()
        done = 0
        while not stop.is_set():
            if cache is None:
                blake3(images[done % len(images)]).digest()
            else:
                cache.get_image_embeddings([images[done % len(images)]])
            done += 1
        counts[index] = done

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    return sum(counts) / seconds


def bench_throughput(seconds: float) -> list[tuple[str, ...]]:
    """Hits/s on hot keys by thread count, next to the same threads running blake3 alone.

    blake3 (like hashlib) releases the GIL for inputs of 2 KiB and more; the floor rows show
    what the hash alone does with threads, so the cache's own share can be told apart.
    """
    rows = []
    for size in (32, 256, 512, 1024):
        hot = [small_jpeg(seed, size) for seed in range(8)]
        label = f"{len(hot[0]) / 1e3:,.1f} KB JPEG"
        cache = VisionEmbeddingCache(tiers=None)
        cache.set_image_embeddings(hot, [EMBEDDING] * len(hot))
        rates = {threads: throughput(cache, hot, threads, seconds) for threads in (1, 2, 8)}
        floor = {threads: throughput(None, hot, threads, seconds) for threads in (1, 8)}
        for threads, rate in rates.items():
            ratio = rate / rates[1]
            verdict = "ok" if threads != 8 or ratio >= 0.8 else "MISSED"
            detail = f"{ratio:.2f}x of 1 thread"
            if threads == 8:
                detail += f" (blake3 alone: {floor[8] / floor[1]:.2f}x)"
            rows.append(
                (
                    f"hits/s, {label}, {threads} thread(s)",
                    f"{rate:,.0f}",
                    detail,
                    ">= 0.8x" if threads == 8 else "",
                    verdict,
                )
            )
    return rows


def bench_single_flight() -> list[tuple[str, ...]]:
    cache = VisionEmbeddingCache()
    image = small_jpeg(1000)
    calls = []
    barrier = threading.Barrier(16)

    def encode(images: list[bytes]) -> list[np.ndarray]:
        calls.append(len(images))
        time.sleep(0.2)
        return [EMBEDDING for _ in images]

    def ask() -> None:
        barrier.wait()
        cache.encode_images([image], encode)

    started = time.perf_counter()
    workers = [threading.Thread(target=ask) for _ in range(16)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - started
    ok = len(calls) == 1 and wall < 0.3
    return [
        (
            "16 threads, one new image, 200 ms encode",
            f"{len(calls)} encode(s)",
            f"wall {wall * 1e3:.0f} ms",
            "1 encode, ~200 ms",
            "ok" if ok else "MISSED",
        )
    ]


def bench_latency_vs_size() -> list[tuple[str, ...]]:
    probes = [small_jpeg(seed, 32) for seed in range(2000, 2200)]
    caches = {}
    for entries in (10**2, 10**4, 10**5):
        cache = VisionEmbeddingCache(max_embedding_entries=None, max_embedding_bytes=None)
        fillers = [index.to_bytes(8, "little") for index in range(entries - len(probes))]  # content
        images = probes + fillers  # at least the probes: 200 entries where 100 are asked for
        cache.set_image_embeddings(images, [EMBEDDING] * len(images))
        caches[entries] = cache
    cursor = {entries: 0 for entries in caches}

    def lookup(entries: int) -> None:
        cursor[entries] = (cursor[entries] + 1) % len(probes)
        assert caches[entries].get_image_embeddings([probes[cursor[entries]]])[0] is EMBEDDING

    times = interleaved_medians({str(n): (lambda n=n: lookup(n)) for n in caches}, rounds=20000)
    smallest = times[str(10**2)]
    return [
        (
            f"hit latency, {int(n):,} entries",
            f"{t * 1e6:.1f} us",
            f"{t / smallest:.2f}x of 100 entries",
            "<= 1.2x" if int(n) == 10**5 else "",
            "ok" if t / smallest <= 1.2 else "MISSED",
        )
        for n, t in times.items()
    ]


def bench_encode_batch() -> list[tuple[str, ...]]:
    cache = VisionEmbeddingCache()
    images = [small_jpeg(seed, 32) for seed in range(3000, 3040)]
    cached = images[::2]
    cache.set_image_embeddings(cached, [EMBEDDING] * len(cached))
    rng = random.Random(0)
    requests = [[rng.choice(images) for _ in range(4)] for _ in range(32)]
    calls: list[list[str]] = []

    def encode(missing: list[bytes]) -> list[np.ndarray]:
        calls.append([compute_image_hash(image) for image in missing])
        return [EMBEDDING for _ in missing]

    results = cache.encode_batch(requests, encode)
    wanted = {compute_image_hash(i) for request in requests for i in request} - {
        compute_image_hash(i) for i in cached
    }
    ok = len(calls) == 1 and sorted(calls[0]) == sorted(wanted) and len(calls[0]) == len(wanted)
    ok = ok and [len(r) for r in results] == [4] * 32
    return [
        (
            "encode_batch 32x4 from 40, half cached",
            f"{len(calls)} call(s)",
            f"{len(calls[0])} images sent, {len(wanted)} distinct missing",
            "1 call, exact set",
            "ok" if ok else "MISSED",
        )
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="duration of each throughput run")
    args = parser.parse_args()
    rows = bench_throughput(args.seconds) + bench_single_flight() + bench_latency_vs_size()
    rows += bench_encode_batch()
    print_table(rows, ("measurement", "value", "ratio / detail", "target", ""))
    return 0 if all(row[-1] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
