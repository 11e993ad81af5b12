"""Cost-aware eviction against LRU, side by side in one run, on a mixed workload under a tight budget.

One `Store` holds two kinds of entry, as a cache sharing one budget between pixels and embeddings
would: pixel values (18.8 MB, ~22 ms to recompute: decode + preprocess of a 1024x768 image) and
embeddings (3 MB, ~4.5 s to recompute: a 2B-class vision tower on 2 CPU cores, 448 px). A request
for an image looks up its embedding; on a miss it looks up the pixels (recomputing them on a miss)
and then encodes. Images are drawn from a Zipf-like popularity over a catalogue larger than the
budget. The same trace runs through ``policy="lru"`` and ``policy="cost"``; the table prints hit
rates and the seconds of work each policy saved and paid.

usage: python benchmarks/bench_eviction.py [--requests N] [--images N] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from visioncache.store.store import Store

from _timing import print_table

PIXELS_BYTES, PIXELS_SECONDS = 18_800_000, 0.022
EMBEDDING_BYTES, EMBEDDING_SECONDS = 3_000_000, 4.5


class Sized:
    """A stand-in value: the store sizes it by ``nbytes`` without allocating the bytes."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


@dataclass
class Outcome:
    embedding_hits: int = 0
    pixel_hits: int = 0
    lookups: int = 0
    saved: float = 0.0
    paid: float = 0.0


def run(policy: str, trace: list[int], budget: int) -> Outcome:
    store, outcome = Store(max_bytes=budget, policy=policy), Outcome()
    for image in trace:
        outcome.lookups += 1
        if store.lookup(f"embedding/{image}") is not None:
            outcome.embedding_hits += 1
            outcome.saved += EMBEDDING_SECONDS + PIXELS_SECONDS
            continue
        if store.lookup(f"pixels/{image}") is not None:
            outcome.pixel_hits += 1
            outcome.saved += PIXELS_SECONDS
        else:
            outcome.paid += PIXELS_SECONDS
            store.put(f"pixels/{image}", Sized(PIXELS_BYTES), cost=PIXELS_SECONDS)
        outcome.paid += EMBEDDING_SECONDS
        store.put(f"embedding/{image}", Sized(EMBEDDING_BYTES), cost=EMBEDDING_SECONDS)
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="image requests in the trace (20000)")
    parser.add_argument("--images", type=int, default=400, help="distinct images (400)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    popularity = 1.0 / np.arange(1, args.images + 1) ** 0.9  # Zipf-like: a few hot images, a long tail
    trace = rng.choice(args.images, size=args.requests, p=popularity / popularity.sum()).tolist()
    pair = PIXELS_BYTES + EMBEDDING_BYTES
    rows = []
    for fraction in (0.05, 0.1, 0.25):
        budget = int(fraction * args.images * pair)
        lru, cost = run("lru", trace, budget), run("cost", trace, budget)
        for name, outcome in (("lru", lru), ("cost", cost)):
            rows.append(
                (
                    f"{budget / 1e9:.2f} GB ({fraction:.0%} of the images' bytes)",
                    name,
                    f"{outcome.embedding_hits / outcome.lookups:.1%}",
                    f"{outcome.pixel_hits / outcome.lookups:.1%}",
                    f"{outcome.saved / 3600:.2f} h",
                    f"{outcome.paid / 3600:.2f} h",
                    f"{outcome.saved / lru.saved:.2f}x",
                )
            )
    print(f"{args.requests} requests over {args.images} images (Zipf 0.9), seed {args.seed}")
    print_table(
        rows,
        ("budget", "policy", "embedding hits", "pixel hits", "work saved", "work paid", "saved vs lru"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
