"""``visioncache bench``: one chat workload through a real VLM (Qwen2-VL; any described family with
``--family``), with and without the cache.

Modes, measured side by side: no cache (``off``), the reference's prompt-keyed pixel cache
(``prompt_keyed``) and visioncache's per-image pixels and embeddings (``visioncache``).
Why: a user should see, on their own machine, what the cache saves and that it changes no
output. Exit status: 0 when every mode's prefill logits match ``off`` within the tolerance, 1 when
they do not, 2 for a usage error (bad ``--model``, missing extra), reported without a traceback.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from visioncache.cli import Subparsers
from visioncache.errors import ConfigurationError
from visioncache.extras import requires

__all__ = ["add_parser", "run"]

# Largest |logit difference| accepted between modes, per dtype: batching the vision tower's
# inputs differently may reorder floating-point sums, never more than rounding.
TOLERANCES = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}
QUICK = {"users": 2, "turns": 3, "image_size": 112, "generated_images": 1}


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure the cache on a real Qwen2-VL with a multi-user chat workload",
        description=__doc__.splitlines()[0],
    )
    from visioncache.bench.towers import VISION_TOWERS

    model = parser.add_argument_group("model")
    model.add_argument(
        "--family",
        choices=tuple(VISION_TOWERS),
        default="qwen2_vl",
        help="model family of the random-weight model, its offline processor and its chat "
        "placeholder (qwen2_vl)",
    )
    model.add_argument(
        "--vision",
        choices=("tiny", "full"),
        default="tiny",
        help="random-weight vision tower: tiny (fast) or full (a released checkpoint's, where "
        "bench/towers.py knows it: Qwen2-VL-2B's for qwen2_vl)",
    )
    model.add_argument(
        "--model", metavar="PATH", help="a local checkpoint directory (Qwen2-VL, Qwen2.5-VL or Qwen3-VL)"
    )
    model.add_argument("--dtype", choices=tuple(TOLERANCES), default="float32", help="model dtype (float32)")
    model.add_argument(
        "--engine",
        choices=("transformers", "mlx"),
        default="transformers",
        help="run the models with transformers (torch) or mlx-vlm (mlx) (transformers)",
    )
    model.add_argument(
        "--device", default="cpu", help="torch device of the transformers engine, e.g. cuda (cpu)"
    )
    workload = parser.add_argument_group("workload")
    workload.add_argument("--users", type=int, default=4, help="concurrent chat users (4)")
    workload.add_argument("--turns", type=int, default=4, help="turns per conversation (4)")
    workload.add_argument(
        "--image-size", type=int, default=224, help="longest side of each image in pixels (224)"
    )
    workload.add_argument(
        "--generated-images", type=int, default=2, help="generated images besides the four shipped photos (2)"
    )
    workload.add_argument("--seed", type=int, default=0)
    workload.add_argument(
        "--quick",
        action="store_true",
        help="a short workload for CI: "
        + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()),
    )
    from visioncache.commands.bench_video import add_video_arguments

    add_video_arguments(parser)
    output = parser.add_argument_group("output")
    output.add_argument("--json", metavar="PATH", help="write the report as JSON")
    output.add_argument("--plot", metavar="PATH", help="write a PNG chart comparing the modes")
    output.add_argument(
        "--tolerance",
        type=float,
        help="largest accepted |logit difference| (default by dtype: "
        + ", ".join(f"{k} {v:g}" for k, v in TOLERANCES.items())
        + ")",
    )
    output.add_argument("--no-progress", action="store_true", help="no progress bar")


def _build_engine(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """``(run_modes, model, processor)`` for ``args.engine``; a missing extra or a bad ``--model``
    is a ConfigurationError naming what to do."""
    if args.model is not None and (args.vision != "tiny" or args.family != "qwen2_vl"):
        raise ConfigurationError("--vision and --family build a random-weight model; not with --model")
    if args.family != "qwen2_vl" and (args.engine != "transformers" or args.video):
        raise ConfigurationError("--family runs images on the transformers engine (no --video, no mlx)")
    if args.engine == "mlx":
        if args.model is not None:
            raise ConfigurationError("--model is not supported with --engine mlx (random weights only)")
        with requires("mlx", "visioncache bench --engine mlx"):
            from visioncache.bench import mlx_runner
            from visioncache.bench.mlx_pipeline import build_random_model

            model, processor = build_random_model("qwen2_vl", args.vision, dtype=args.dtype)
        return mlx_runner.run_modes, model, processor
    with requires("hf", "visioncache bench"):
        import torch

        from visioncache.bench import models, transformers_runner
        from visioncache.bench.family_models import build_family_model
        from visioncache.bench.vocabulary import IMAGE_PLACEHOLDER
    dtype = getattr(torch, args.dtype)
    placeholder = IMAGE_PLACEHOLDER
    if args.model is not None:
        model, processor = models.load_model(args.model, dtype)
    else:
        built = build_family_model(args.family, args.vision, dtype)
        model, processor, placeholder = built.model, built.processor, built.placeholder
    try:
        model = model.to(args.device)
    except (RuntimeError, AssertionError) as error:
        raise ConfigurationError(f"cannot use --device {args.device}: {error}") from None
    return functools.partial(transformers_runner.run_modes, placeholder=placeholder), model, processor


def _print_table(rows: list[list[str]], title: str) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        print(title)
        for row in rows:
            print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
        return
    table = Table(title=title)
    for index, header in enumerate(rows[0]):
        table.add_column(header, justify="left" if index == 0 else "right")
    for row in rows[1:]:
        table.add_row(*row)
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if args.video and args.engine != "transformers":
        raise ConfigurationError("--video runs on the transformers engine only")
    run_modes, model, processor = _build_engine(args)
    if args.video:
        from visioncache.commands.bench_video import run_video

        tolerance = args.tolerance if args.tolerance is not None else TOLERANCES[args.dtype]
        return run_video(args, model, processor, tolerance, _print_table)
    from tqdm import tqdm

    from visioncache.bench.plot import plot_results
    from visioncache.bench.report import command_line, finish, format_table, image_cost_ratios, report_json
    from visioncache.bench.workload import build_workload

    try:
        workload = build_workload(args.users, args.turns, args.image_size, args.generated_images, args.seed)
    except ValueError as error:
        raise ConfigurationError(str(error)) from None

    def progress(items: Any, description: str) -> Any:
        return tqdm(items, desc=description, unit="req", disable=args.no_progress, file=sys.stderr)

    results, max_diff = run_modes(model, processor, workload, progress)
    repeated = workload.repeated_only()
    tolerance = args.tolerance if args.tolerance is not None else TOLERANCES[args.dtype]
    engine = "mlx-vlm" if args.engine == "mlx" else f"transformers on {args.device}"
    source = args.model or f"random-weight {args.family}, {args.vision} vision tower, {engine}"
    subtitle = (
        f"{source}, {args.dtype}; {len(workload.requests)} requests from {args.users} "
        f"users x {args.turns} turns, {workload.images_sent} images sent "
        f"({workload.distinct_images_sent} distinct, {args.image_size}px)"
    )
    _print_table(format_table(results, repeated), subtitle)
    for mode, ratio in image_cost_ratios(results, repeated).items():
        print(f"a repeated image costs {ratio:,.0f}x less with visioncache than with {mode}")
    settings: dict[str, Any] = {
        "command": command_line(),
        "model": source,
        "family": args.family if args.model is None else None,
        "dtype": args.dtype,
        "users": args.users,
        "turns": args.turns,
        "image_size": args.image_size,
        "generated_images": args.generated_images,
        "seed": args.seed,
        "engine": args.engine,
        "device": args.device if args.engine == "transformers" else "mlx",
    }
    if args.plot:
        plot_results(results, repeated, max_diff, subtitle, args.plot)
    return finish(report_json(results, repeated, max_diff, tolerance, settings), args.json)
