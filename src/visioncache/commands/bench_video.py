"""``visioncache bench --video``: the video workloads through the three modes, and the report.

Only the argument definitions load with the CLI; torch and transformers load when it runs. Exit
status as the image bench's: 0 when every mode's logits match ``off`` within the tolerance,
1 when they do not.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from visioncache.bench.video_workload import SAMPLE_FPS, WORKLOADS, build_video_workloads
from visioncache.errors import ConfigurationError
from visioncache.integrations.video.clip import VideoSettings

__all__ = ["add_video_arguments", "run_video"]


def add_video_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("video (with --video)")
    group.add_argument(
        "--video", action="store_true", help="run the video workloads (per-temporal-patch reuse) instead"
    )
    group.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated video workloads among {', '.join(WORKLOADS)} (all)",
    )
    group.add_argument("--frame-width", type=int, default=112, help="video frame width in pixels (112)")
    group.add_argument(
        "--tower-graphs",
        type=int,
        default=4,
        help="CUDA graphs of the tower the visioncache mode keeps on a GPU (CachedVisionModel; 0: off; 4)",
    )


def run_video(
    args: argparse.Namespace,
    model: Any,
    processor: Any,
    tolerance: float,
    print_table: Callable[[list[list[str]], str], None],
) -> int:
    # torch and transformers load here, not when the CLI builds its parser.
    from visioncache.bench.report import command_line, finish
    from visioncache.bench.video_report import mode_rows, report_json, turn_rows
    from visioncache.bench.video_runner import VideoModeResult, run_video_modes

    names = tuple(name for name in args.workloads.split(",") if name)
    settings = VideoSettings(fps=SAMPLE_FPS)
    try:
        workloads = build_video_workloads(args.turns, args.frame_width, settings, names)
    except ValueError as error:
        raise ConfigurationError(str(error)) from None
    results: dict[str, list[VideoModeResult]] = {}
    source = args.model or f"random-weight Qwen2-VL, {args.vision} vision tower"
    for workload in workloads:
        if not args.no_progress:
            print(f"running the {workload.name} workload ...", file=sys.stderr)
        results[workload.name] = run_video_modes(model, processor, workload, settings, args.tower_graphs)
        title = (
            f"{workload.name}: {workload.description}; {args.turns} turns, {args.frame_width}px frames; "
            f"{source}, {args.dtype}, {args.device}"
        )
        print_table(mode_rows(results[workload.name]), title)
        print_table(turn_rows(results[workload.name]), f"{workload.name}, per turn")
    run_settings = {
        "command": command_line(),
        "model": source,
        "dtype": args.dtype,
        "device": args.device,
        "turns": args.turns,
        "frame_width": args.frame_width,
        "tower_graphs": args.tower_graphs,
        "video_settings": vars(settings),
    }
    descriptions = {workload.name: workload.description for workload in workloads}
    return finish(report_json(results, descriptions, tolerance, run_settings), args.json)
