"""The hit path, this tree against a baseline revision, side by side in one process.

Both versions of visioncache are imported into this process (the baseline from ``git archive`` of
``--baseline``), the same caches are filled, and the hit calls are timed interleaved, so machine
noise hits both alike. Prints the median per call and the ratio (this tree / baseline); the target
is <= 1.0x (no slower than before), within the run's noise. The "8 threads" rows time a pool of 8
threads that each make the same hits (per call: wall time of the pool / hits made), so lock
convoys and GIL hand-offs on the hit path show up too.

usage: python benchmarks/bench_hit_path.py [--baseline REV] [--rounds N]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from _versions import extract, import_visioncache

from _timing import interleaved_medians, print_table

EMBEDDING = np.zeros((999, 1536), dtype=np.float16)  # a 2B-class tower's output for one image
CALLS_PER_SAMPLE = 200
THREADS = 8


class ThreadPool:
    """``THREADS`` threads that each run ``call`` when the pool is run, and wait for each other."""

    def __init__(self, call: Callable[[], object]) -> None:
        self._call = call
        self._start = threading.Barrier(THREADS + 1)
        self._done = threading.Barrier(THREADS + 1)
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(THREADS)]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            self._start.wait()
            self._call()
            self._done.wait()

    def __call__(self) -> None:
        self._start.wait()
        self._done.wait()
        # Until every thread waits again: none may still be running when the next call is timed.
        while self._start.n_waiting < THREADS:
            time.sleep(0)


def jpeg(seed: int, size: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def scenarios(package: ModuleType, images: dict[str, Any], path: str) -> dict[str, Any]:
    """Filled caches and the hit calls to time, for one version of visioncache."""
    cache = package.VisionEmbeddingCache(namespace="bench", tiers=None)
    small, photo = images["small"], images["photo"]
    batch = [jpeg(seed, 48) for seed in range(8)]
    cache.set_image_embeddings([small, photo, path, *batch], [EMBEDDING] * (3 + len(batch)))
    cache.set_pixel_cache([small], "prompt", EMBEDDING, EMBEDDING)

    def encode(_images: list[Any]) -> list[Any]:
        raise AssertionError("a hit must not encode")

    def repeat(call: Any) -> Any:
        def run() -> None:
            for _ in range(CALLS_PER_SAMPLE):
                call()

        return run

    per_thread = CALLS_PER_SAMPLE // THREADS  # the same hits per sample as one thread makes

    def threaded(call: Any) -> Any:
        def run() -> None:
            for _ in range(per_thread):
                call()

        return ThreadPool(run)

    return {
        f"encode_images, 1 image ({len(small) / 1e3:.1f} KB)": repeat(
            lambda: cache.encode_images([small], encode)
        ),
        f"encode_images, 1 image, {THREADS} threads": threaded(lambda: cache.encode_images([small], encode)),
        f"get_pixel_cache, {THREADS} threads": threaded(lambda: cache.get_pixel_cache([small], "prompt")),
        "encode_images, 8 images": repeat(lambda: cache.encode_images(batch, encode)),
        f"get_image_embeddings ({len(photo) / 1e3:.0f} KB)": repeat(
            lambda: cache.get_image_embeddings([photo])
        ),
        "encode_images, unchanged path": repeat(lambda: cache.encode_images([path], encode)),
        "get_pixel_cache (reference API)": repeat(lambda: cache.get_pixel_cache([small], "prompt")),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="a484fec", help="git revision to compare with (a484fec)")
    parser.add_argument("--rounds", type=int, default=200, help="interleaved samples per call (200)")
    args = parser.parse_args()
    images = {"small": jpeg(1, 32), "photo": jpeg(2, 512)}
    with tempfile.TemporaryDirectory() as scratch:
        image_path = Path(scratch) / "image.jpg"
        image_path.write_bytes(jpeg(3, 256))
        os.utime(image_path, (1e9, 1e9))  # settled: the path memo may remember it ...
        time.sleep(2.05)  # ... once its ctime, which nothing sets back, is 2 s old as well
        old = scenarios(import_visioncache(extract(args.baseline, Path(scratch))), images, str(image_path))
        new = scenarios(import_visioncache(None), images, str(image_path))
        candidates = {f"{name}|baseline": call for name, call in old.items()}
        candidates.update({f"{name}|this tree": call for name, call in new.items()})
        medians = interleaved_medians(candidates, args.rounds)
    rows = []
    for name in new:
        before = medians[f"{name}|baseline"] / CALLS_PER_SAMPLE
        after = medians[f"{name}|this tree"] / CALLS_PER_SAMPLE
        rows.append((name, f"{before * 1e6:.2f} us", f"{after * 1e6:.2f} us", f"{after / before:.2f}x"))
    print(f"hit path: this tree vs {args.baseline}, median of {args.rounds} interleaved samples")
    print_table(rows, ("hit", f"baseline ({args.baseline})", "this tree", "this tree / baseline"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
