"""The bench's chart: where each mode's time went, and what a repeated image costs in each.

Why: a reader should grasp the result in five seconds, so the chart has two panels with the
modes in the same order and colours: total time split into vision encoding / preprocessing /
the rest (left), and seconds per repeated image on a log scale, labelled with the ratio (right).
The headline (title) states the speed-up and the logit check. Engine-agnostic.
"""

from __future__ import annotations

from pathlib import Path

from visioncache.bench.report import ModeResult, format_seconds, image_cost_ratios
from visioncache.extras import requires

__all__ = ["plot_results"]

COLOURS = {"encode": "#d62728", "preprocess": "#ff7f0e", "rest": "#7f7f7f"}
MODE_COLOURS = {"off": "#7f7f7f", "prompt_keyed": "#1f77b4", "visioncache": "#2ca02c"}


def plot_results(
    results: list[ModeResult],
    repeated_only: list[bool],
    max_abs_logit_diff: float,
    subtitle: str,
    path: str | Path,
) -> None:
    """Write the two-panel PNG comparing ``results`` to ``path``."""
    with requires("hf", "visioncache bench --plot"):
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on servers and CI
        import matplotlib.pyplot as plt

    modes = [result.mode for result in results]
    figure, (time_axis, cost_axis) = plt.subplots(
        1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1.15, 1]}
    )
    positions = range(len(results))[::-1]  # first mode on top
    encode = [r.encode_s for r in results]
    preprocess = [r.preprocess_s for r in results]
    rest = [max(r.wall_s - r.encode_s - r.preprocess_s, 0.0) for r in results]
    time_axis.barh(positions, encode, color=COLOURS["encode"], label="vision encoding")
    time_axis.barh(positions, preprocess, left=encode, color=COLOURS["preprocess"], label="preprocessing")
    time_axis.barh(
        positions,
        rest,
        left=[e + p for e, p in zip(encode, preprocess, strict=True)],
        color=COLOURS["rest"],
        label="text prefill + other",
    )
    for position, result in zip(positions, results, strict=True):
        time_axis.text(
            result.wall_s,
            position,
            f"  {format_seconds(result.wall_s)}\n  {result.images_encoded}/"
            f"{result.images_sent} images encoded",
            va="center",
            fontsize=9,
        )
    time_axis.set_yticks(list(positions), modes, fontsize=11)
    time_axis.set_xlim(0, max(r.wall_s for r in results) * 1.45)
    time_axis.set_xlabel("total time for the workload (s)")
    time_axis.set_title("Where the time went", fontsize=11)
    time_axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=3, fontsize=9, frameon=False)

    costs = [r.seconds_per_repeated_image(repeated_only) for r in results]
    ratios = image_cost_ratios(results, repeated_only)
    cost_axis.barh(positions, costs, color=[MODE_COLOURS.get(m, "#9467bd") for m in modes])
    cost_axis.set_xscale("log")
    for position, mode, cost in zip(positions, modes, costs, strict=True):
        ratio = f"\n  {ratios[mode]:,.0f}x visioncache's cost" if mode in ratios else ""
        cost_axis.text(cost, position, f"  {format_seconds(cost)}{ratio}", va="center", fontsize=9)
    positive = [c for c in costs if c > 0] or [1.0]
    cost_axis.set_xlim(min(positive) / 3, max(positive) * 5000)
    cost_axis.set_yticks(list(positions), modes, fontsize=11)
    cost_axis.set_xlabel("seconds per repeated image (log scale)")
    cost_axis.set_title("Cost of an image the server has seen before", fontsize=11)

    off = next((r for r in results if r.mode == "off"), None)
    cached = next((r for r in results if r.mode == "visioncache"), None)
    speedup = (
        f"visioncache: {off.wall_s / cached.wall_s:.1f}x faster end to end, "
        if off and cached and cached.wall_s > 0
        else ""
    )
    figure.suptitle(f"{speedup}max |logit difference| = {max_abs_logit_diff:.2g}\n{subtitle}", fontsize=12)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
