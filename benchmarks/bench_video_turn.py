"""A warm video turn's vision time, before (another revision's source) and after (this tree's).

Why: on a GPU the vision tower's share of a video turn is small, so what a visioncache turn costs
next to ``off`` is its CPU-side work (hashing, decoding, preprocessing). This runs the warm turns
of ``visioncache bench --video``'s workloads (random-weight Qwen2-VL, tiny tower, fp32, one torch
thread) in ``off`` and ``visioncache`` modes, times the tower apart (every ``get_video_features``
call), and prints per revision: vision time per warm turn, its ratio to ``off``, and the ratio
with the tower's time taken out of both modes (what a GPU's near-free tower leaves). The two
revisions run in child processes, alternately, ``--rounds`` times each; medians are printed side
by side.

usage: python benchmarks/bench_video_turn.py --before /path/to/main/src [--frame-width 448]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _timing import print_table

HERE = Path(__file__).resolve().parent.parent


def child(
    workload_name: str, frame_width: int, turns: int, device: str, vision: str, dtype: str
) -> dict[str, float]:
    """One revision's warm-turn figures (this process imports whichever visioncache is first)."""
    import torch

    from visioncache.bench.family_models import build_family_model
    from visioncache.bench.video_runner import _Modes
    from visioncache.bench.video_workload import SAMPLE_FPS, build_video_workloads
    from visioncache.integrations.video.clip import VideoSettings

    torch.set_num_threads(1)  # a core shared with other work stalls torch's second thread
    built = build_family_model("qwen2_vl", vision, getattr(torch, dtype))
    model = built.model.to(device)
    tower_seconds = [0.0]
    tower = model.get_video_features

    def timed_tower(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return tower(*args, **kwargs)
        finally:
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            tower_seconds[0] += time.perf_counter() - started

    model.get_video_features = timed_tower
    settings = VideoSettings(fps=SAMPLE_FPS)
    workload = build_video_workloads(turns, frame_width, settings, (workload_name,))[0]
    modes = _Modes(model, built.processor, settings)
    obtain = {"off": modes.obtain("off"), "visioncache": modes.obtain("visioncache")}
    totals = {f"{mode}_{part}": 0.0 for mode in obtain for part in ("vision", "tower")}
    for turn, request in enumerate(workload.requests):
        for mode, function in obtain.items():
            tower_seconds[0] = 0.0
            started = time.perf_counter()
            function(request.video)
            elapsed = time.perf_counter() - started
            if turn > 0:  # warm turns only
                totals[f"{mode}_vision"] += elapsed
                totals[f"{mode}_tower"] += tower_seconds[0]
    warm = len(workload.requests) - 1
    return {name: value / warm for name, value in totals.items()}


def run_revision(source: Path, args: argparse.Namespace) -> dict[str, float]:
    path = os.pathsep.join([str(source), str(HERE), os.environ.get("PYTHONPATH", "")])
    environment = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    facts = [args.workload, args.frame_width, args.turns, args.device, args.vision, args.dtype]
    command = [sys.executable, __file__, "--child", *map(str, facts)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the {source} run failed:\n{result.stderr}")
    output = result.stdout
    figures: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="src/ of the revision to compare with")
    parser.add_argument("--workload", default="sliding", help="a video workload (sliding)")
    parser.add_argument("--frame-width", type=int, default=448, help="frame width in pixels (448)")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each revision, alternately")
    parser.add_argument("--device", default="cpu", help="torch device (cpu)")
    parser.add_argument("--vision", choices=("tiny", "full"), default="tiny", help="vision tower (tiny)")
    parser.add_argument("--dtype", default="float32", help="torch dtype (float32)")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, width, turns, device, vision, dtype = args.child
        print(json.dumps(child(name, int(width), int(turns), device, vision, dtype)))
        return
    if args.before is None:
        parser.error("--before SRC is required")
    revisions = {"before": args.before.resolve(), "after": HERE / "src"}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in revisions}
    for _ in range(args.rounds):
        for name, source in revisions.items():
            runs[name].append(run_revision(source, args))
    rows = []
    for name, samples in runs.items():
        figure = {key: statistics.median(sample[key] for sample in samples) for key in samples[0]}
        off, cached = figure["off_vision"], figure["visioncache_vision"]
        off_cpu, cached_cpu = off - figure["off_tower"], cached - figure["visioncache_tower"]
        rows.append(
            (
                name,
                f"{off * 1e3:.1f} ms",
                f"{cached * 1e3:.1f} ms",
                f"{cached / off:.1%}",
                f"{off_cpu * 1e3:.1f} ms",
                f"{cached_cpu * 1e3:.1f} ms",
                f"{cached_cpu / off_cpu:.1%}",
            )
        )
    print(
        f"{args.workload}, {args.frame_width}px frames, {args.vision} tower, {args.dtype}, {args.device}; "
        f"warm turns 2-{args.turns}, per turn (median of {args.rounds} runs each)"
    )
    header = ("revision", "off", "visioncache", "ratio", "off - tower", "vc - tower", "ratio w/o tower")
    print_table(rows, header)


if __name__ == "__main__":
    main()
