"""What one bench mode measured, and the side-by-side table and JSON report of all modes.

Why: the bench's claim is a ratio measured in one run on one workload, so every mode reports
the same fields, computed the same way, and the report states the logit check that makes the
ratio honest (a cache that changed outputs would be fast and wrong). Engine-agnostic.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from visioncache.stats import CacheStats, hit_rate

__all__ = [
    "ModeResult",
    "command_line",
    "finish",
    "format_seconds",
    "format_table",
    "image_cost_ratios",
    "logit_check",
    "report_json",
]


@dataclass
class ModeResult:
    """Totals of one mode over the workload; per-request lists are in request order."""

    mode: str
    wall_s: float = 0.0
    preprocess_s: float = 0.0
    encode_s: float = 0.0
    images_encoded: int = 0
    images_sent: int = 0
    # per request: seconds spent on its images (pixels + vision output), and to prefill logits
    image_s: list[float] = field(default_factory=list)
    prefill_s: list[float] = field(default_factory=list)
    images_per_request: list[int] = field(default_factory=list)
    stats: CacheStats | None = None  # the cache's snapshot(), if the mode has a cache

    @property
    def requests(self) -> int:
        return len(self.prefill_s)

    def hit_rate(self, level: str) -> float:
        if self.stats is None:
            return 0.0
        counters = self.stats.levels[level]
        return hit_rate(counters.hits, counters.misses)

    @property
    def bytes_cached(self) -> int:
        return sum(level.bytes for level in self.stats.levels.values()) if self.stats is not None else 0

    @property
    def device_bytes_cached(self) -> int:
        """Of `bytes_cached`, held on an accelerator (where the hits need no copy)."""
        levels = self.stats.levels.values() if self.stats is not None else ()
        return sum(level.device_bytes for level in levels)

    @property
    def spills(self) -> int:
        """Device entries copied to the host when the device budget was full."""
        return sum(level.spills for level in self.stats.levels.values()) if self.stats is not None else 0

    def prefill_percentile(self, percent: int) -> float:
        if len(self.prefill_s) < 2:
            return self.prefill_s[0] if self.prefill_s else 0.0
        return statistics.quantiles(self.prefill_s, n=100, method="inclusive")[percent - 1]

    def seconds_per_repeated_image(self, repeated_only: list[bool]) -> float:
        """Image seconds per image over the requests that only resend images sent before."""
        pairs = [
            (seconds, images)
            for seconds, images, repeated in zip(
                self.image_s, self.images_per_request, repeated_only, strict=True
            )
            if repeated
        ]
        images = sum(images for _, images in pairs)
        return sum(seconds for seconds, _ in pairs) / images if images else 0.0

    def to_json(self, repeated_only: list[bool]) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "preprocess_s": self.preprocess_s,
            "encode_s": self.encode_s,
            "images_encoded": self.images_encoded,
            "images_sent": self.images_sent,
            "requests": self.requests,
            "pixel_hit_rate": self.hit_rate("pixel"),
            "pixel_only_hit_rate": self.hit_rate("pixel_only"),
            "embedding_hit_rate": self.hit_rate("embedding"),
            "bytes_cached": self.bytes_cached,
            "device_bytes_cached": self.device_bytes_cached,
            "spills": self.spills,
            "prefill_p50_s": self.prefill_percentile(50),
            "prefill_p95_s": self.prefill_percentile(95),
            "seconds_per_repeated_image": self.seconds_per_repeated_image(repeated_only),
        }


def image_cost_ratios(
    results: list[ModeResult], repeated_only: list[bool], cached_mode: str = "visioncache"
) -> dict[str, float]:
    """How many times cheaper a repeated image is in ``cached_mode`` than in each other mode."""
    costs = {result.mode: result.seconds_per_repeated_image(repeated_only) for result in results}
    cached = costs.get(cached_mode, 0.0)
    return {mode: cost / cached for mode, cost in costs.items() if mode != cached_mode and cached > 0}


def report_json(
    results: list[ModeResult],
    repeated_only: list[bool],
    max_abs_logit_diff: float,
    tolerance: float,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The ``--json`` report: per-mode measurements, the logit check, ratios and the settings."""
    return {
        "settings": settings,
        **logit_check(max_abs_logit_diff, tolerance),
        "repeated_image_cost_ratio": image_cost_ratios(results, repeated_only),
        "modes": {result.mode: result.to_json(repeated_only) for result in results},
    }


def logit_check(max_abs_logit_diff: float, tolerance: float) -> dict[str, Any]:
    """The report's verdict: the largest logit difference between modes, the tolerance, and
    whether the outputs match (every bench report, image or video, states it the same way)."""
    return {
        "max_abs_logit_diff": max_abs_logit_diff,
        "logit_tolerance": tolerance,
        "outputs_match": max_abs_logit_diff <= tolerance,
    }


def command_line(argv: Sequence[str] = sys.argv) -> str:
    """The ``visioncache bench ...`` command this process runs, as one shell line."""
    arguments = argv[2:] if list(argv[1:2]) == ["bench"] else argv[1:]
    return "visioncache bench " + shlex.join(arguments)


def finish(report: dict[str, Any], json_path: str | None) -> int:
    """Print the verdict, write the ``--json`` report, and return the exit status (0: outputs match)."""
    verdict = "OK" if report["outputs_match"] else "MISMATCH"
    print(
        f"max |logit difference| between modes: {report['max_abs_logit_diff']:.3g} "
        f"(tolerance {report['logit_tolerance']:g}): {verdict}"
    )
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["outputs_match"] else 1


def format_seconds(seconds: float) -> str:
    """Seconds in the unit that keeps 2-3 significant digits readable (s, ms or µs)."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _fmt_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def format_table(results: list[ModeResult], repeated_only: list[bool]) -> list[list[str]]:
    """Rows (header first) of the side-by-side table, one column per mode."""
    rows = [["", *(result.mode for result in results)]]
    measures: list[tuple[str, Any]] = [
        ("wall time", lambda r: format_seconds(r.wall_s)),
        ("preprocessing", lambda r: format_seconds(r.preprocess_s)),
        ("vision encoding", lambda r: format_seconds(r.encode_s)),
        ("images encoded / sent", lambda r: f"{r.images_encoded} / {r.images_sent}"),
        ("pixel hit rate", lambda r: f"{max(r.hit_rate('pixel'), r.hit_rate('pixel_only')):.0%}"),
        ("embedding hit rate", lambda r: f"{r.hit_rate('embedding'):.0%}"),
        ("bytes cached", lambda r: _fmt_bytes(r.bytes_cached)),
        ("  on the device", lambda r: f"{_fmt_bytes(r.device_bytes_cached)}, {r.spills} spills"),
        ("prefill p50", lambda r: format_seconds(r.prefill_percentile(50))),
        ("prefill p95", lambda r: format_seconds(r.prefill_percentile(95))),
        ("per repeated image", lambda r: format_seconds(r.seconds_per_repeated_image(repeated_only))),
    ]
    for label, measure in measures:
        rows.append([label, *(measure(result) for result in results)])
    return rows
