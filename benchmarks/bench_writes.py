"""Write cost per entry, this tree against a baseline revision, side by side in one process.

A write is what a miss costs beyond its encode: storing the new value in memory and queueing it
for the shared tiers (the caller's thread), then serialising and writing it (the tier writer's
thread). Both versions of visioncache are imported into this process (`_versions.py`) and each
writes the same values under new keys, interleaved, into a tier that keeps nothing (so disk and
network stay out of the figure). Per value kind it prints the median caller-thread time, the
median time until the write is done (``flush``), and this tree / baseline for each.

usage: python benchmarks/bench_writes.py [--baseline REV] [--rounds N]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _versions import extract, import_visioncache

from _timing import print_table

VALUES: dict[str, Callable[[], Any]] = {
    "embedding 999x1536 fp16, numpy (3.1 MB)": lambda: np.ones((999, 1536), np.float16),
    "embedding 999x1536 bf16, torch (3.1 MB)": lambda: torch.ones((999, 1536), dtype=torch.bfloat16),
    "deepstack: 4 arrays in a dict, torch (12 MB)": lambda: {
        "embeds": torch.ones((999, 1536)),
        "deepstack": [torch.ones((999, 1536)) for _ in range(3)],
    },
    "pixel values 3996x1176 fp32, numpy (18.8 MB)": lambda: np.ones((3996, 1176), np.float32),
}


class DiscardingTier:
    """A tier that keeps nothing: the benchmark times visioncache's work, not a disk's."""

    name = "discard"
    network = False

    def __init__(self, sizes_type: type) -> None:
        self._sizes_type = sizes_type

    def get(self, key: str) -> bytes | None:
        return None

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [None] * len(keys)

    def put(self, key: str, blob: bytes) -> None:
        assert isinstance(blob, bytes)

    def delete(self, key: str) -> None:
        pass

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        return [False] * len(keys)

    def keys(self) -> Iterator[str]:
        return iter(())

    def sizes(self) -> Any:
        return self._sizes_type()

    def stored_bytes(self, keys: Sequence[str]) -> int:
        return 0

    def close(self) -> None:
        pass


def writer(package: ModuleType, value: Any) -> Callable[[], tuple[float, float]]:
    """One write per call under a new key: (caller-thread seconds, seconds until written)."""
    tier = DiscardingTier(package.tiers.stats.TierSizes)
    cache = package.VisionEmbeddingCache(namespace="bench-writes", tiers=package.tiers.TierChain([tier]))
    counter = itertools.count()

    def write() -> tuple[float, float]:
        key = f"{next(counter):016d}".encode()
        item = package.ContentId(f"bench:{key.decode()}")
        started = time.perf_counter()
        cache.encode_images([item], lambda images: [value for _ in images])
        queued = time.perf_counter()
        assert cache.tiers.flush(timeout=60)
        done = time.perf_counter()
        cache.clear()  # memory stays small; the next key is new anyway
        return queued - started, done - started

    return write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="a3ee514", help="git revision to compare with (a3ee514)")
    parser.add_argument("--rounds", type=int, default=40, help="interleaved writes per version and value")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        versions = {
            "baseline": import_visioncache(extract(args.baseline, Path(scratch))),
            "this tree": import_visioncache(None),
        }
        rows = []
        for label, make in VALUES.items():
            value = make()
            writes = {name: writer(package, value) for name, package in versions.items()}
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in writes}
            for write in writes.values():
                write()  # warm up
            for _ in range(args.rounds):
                for name, write in writes.items():
                    samples[name].append(write())
            caller = {name: statistics.median(s[0] for s in runs) for name, runs in samples.items()}
            total = {name: statistics.median(s[1] for s in runs) for name, runs in samples.items()}
            rows.append(
                (
                    label,
                    f"{caller['baseline'] * 1e3:.2f}",
                    f"{caller['this tree'] * 1e3:.2f}",
                    f"{caller['this tree'] / caller['baseline']:.2f}x",
                    f"{total['baseline'] * 1e3:.2f}",
                    f"{total['this tree'] * 1e3:.2f}",
                    f"{total['this tree'] / total['baseline']:.2f}x",
                )
            )
    print(f"write cost per entry, this tree vs {args.baseline}, median of {args.rounds} interleaved writes")
    header = (
        "value",
        "caller ms (base)",
        "caller ms (this)",
        "caller ratio",
        "done ms (base)",
        "done ms (this)",
        "done ratio",
    )
    print_table(rows, header)


if __name__ == "__main__":
    main()
