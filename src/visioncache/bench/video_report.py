"""The video bench's report: per workload, the modes side by side, and their turns.

Why: the claim is per turn (from turn 2 on, visioncache encodes only the new temporal patches),
so the report shows each turn's patches encoded / sent and vision time next to the totals, and
the vision-time ratio of turns >= 2 against the fraction of patches that were new.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from visioncache.bench.report import format_seconds, logit_check
from visioncache.bench.video_runner import VideoModeResult

__all__ = ["later_turns", "mode_rows", "report_json", "turn_rows"]


def later_turns(result: VideoModeResult) -> dict[str, float]:
    """Totals over turns >= 2: patches encoded and sent, vision and TTFT seconds."""
    turns = result.turns[1:]
    return {
        "patches_encoded": sum(turn.patches_encoded for turn in turns),
        "patches_sent": sum(turn.patches_sent for turn in turns),
        "vision_s": sum(turn.vision_s for turn in turns),
        "ttft_s": sum(turn.ttft_s for turn in turns),
    }


MODE_MEASURES = (
    "wall time",
    "patches encoded / sent",
    "turns >= 2: encoded / sent",
    "turns >= 2: vision time",
    "turns >= 2: vision vs off",
    "TTFT, turn 1",
    "TTFT, turns >= 2 (mean)",
    "max |logit diff| vs off",
)


def _mode_column(result: VideoModeResult, off: dict[str, float]) -> list[str]:
    turns, later = result.turns, later_turns(result)
    return [
        format_seconds(sum(turn.ttft_s for turn in turns)),
        f"{sum(turn.patches_encoded for turn in turns)} / {sum(turn.patches_sent for turn in turns)}",
        f"{later['patches_encoded']:.0f} / {later['patches_sent']:.0f}",
        format_seconds(later["vision_s"]),
        f"{later['vision_s'] / off['vision_s']:.1%}" if off["vision_s"] else "-",
        format_seconds(turns[0].ttft_s),
        format_seconds(later["ttft_s"] / max(len(turns) - 1, 1)),
        f"{max(turn.max_logit_diff for turn in turns):.2g}",
    ]


def mode_rows(results: list[VideoModeResult]) -> list[list[str]]:
    """Rows (header first) of one workload's modes, side by side (``off`` first)."""
    off = later_turns(results[0])
    columns = [_mode_column(result, off) for result in results]
    rows = [["", *(result.mode for result in results)]]
    for index, label in enumerate(MODE_MEASURES):
        rows.append([label, *(column[index] for column in columns)])
    return rows


def turn_rows(results: list[VideoModeResult]) -> list[list[str]]:
    """Rows (header first): per turn and mode, patches encoded / sent and vision seconds."""
    rows = [["turn", *(f"{result.mode}: encoded/sent, vision" for result in results)]]
    for index in range(len(results[0].turns)):
        cells = [
            f"{r.turns[index].patches_encoded}/{r.turns[index].patches_sent}, "
            f"{format_seconds(r.turns[index].vision_s)}"
            for r in results
        ]
        rows.append([str(index + 1), *cells])
    return rows


def report_json(
    results_by_workload: dict[str, list[VideoModeResult]],
    descriptions: dict[str, str],
    tolerance: float,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The ``--json`` report: per workload and mode, every turn, totals of turns >= 2."""
    max_diff = max(
        (
            turn.max_logit_diff
            for results in results_by_workload.values()
            for r in results
            for turn in r.turns
        ),
        default=0.0,
    )
    return {
        "settings": settings,
        **logit_check(max_diff, tolerance),
        "workloads": {
            name: {
                "description": descriptions[name],
                "modes": {
                    r.mode: {"turns": [asdict(turn) for turn in r.turns], "turns_2_on": later_turns(r)}
                    for r in results
                },
            }
            for name, results in results_by_workload.items()
        },
    }
