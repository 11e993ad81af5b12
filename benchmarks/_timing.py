"""Side-by-side timing: candidates are run interleaved, so machine noise hits them alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(candidates: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds per call of each candidate, measured round-robin ``rounds`` times."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for function in candidates.values():  # warm up caches, memos and lazy imports
        function()
    for _ in range(rounds):
        for name, function in candidates.items():
            started = time.perf_counter()
            function()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def print_table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
