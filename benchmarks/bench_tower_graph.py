"""What a CUDA graph would do to a warm sliding-window video turn: the one-patch tower call, timed.

A warm `sliding` video turn with visioncache encodes 1 temporal patch of 8, yet on a GPU its vision
time stays near a third of the uncached turn's: the one-patch call of the Qwen2-VL tower is bound by
its ~730 kernel launches and the host syncs between them, not by the GPU (docs/benchmarks.md, "A
warm video turn's CPU side"). This script measures, side by side in one run, on one frame size:

- the tower's eager call on 1 temporal patch and on 8 (the uncached clip of 16 frames);
- the same one-patch call through ``TowerGraphs`` (``integrations/transformers/tower_graphs.py``,
  what ``CachedVisionModel`` uses): its chain (patch_embed -> blocks -> merger) run eagerly from
  the grid inputs recorded from the eager forward, and (GPU only) that chain replayed from a CUDA
  graph. Each is kept only once its first output is ``torch.equal`` to the eager call's;
- the image processor on the 2 frames a warm turn brings and on 16, and blake3 over 16 frames
  (what a warm turn hashes), so the turn ratio can be estimated from figures of the same run:
  (tower(1) + preprocess(2) + hash(16)) / (tower(8) + preprocess(16)), eager and graphed.

usage: python benchmarks/bench_tower_graph.py [--device cuda|cpu] [--vision full|tiny]
                                              [--frame-width 448] [--repeats N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import blake3
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_gpu import build_tower, describe_device, image_processor, median_seconds
from visioncache.integrations.transformers.tower_graphs import TowerGraphs

PATCH = 14  # Qwen2-VL's patch size; a temporal patch is 2 frames
TEMPORAL = 2
CLIP_PATCHES = 8  # 16 frames


def median_ms(call: Callable[[], object], repeats: int, synchronize: Callable[[], None]) -> float:
    return median_seconds(call, repeats, synchronize) * 1e3


def grid_inputs(patches: int, height: int, width: int, device: torch.device, dtype: torch.dtype) -> Any:
    """Pixel values and grid of ``patches`` temporal patches of height x width frames (random values)."""
    tokens = patches * (height // PATCH) * (width // PATCH)
    pixels = torch.randn(tokens, 3 * TEMPORAL * PATCH * PATCH, device=device, dtype=dtype)
    grid = torch.tensor([[patches, height // PATCH, width // PATCH]], device=device)
    return pixels, grid


def pooled(output: Any) -> torch.Tensor:
    return output.pooler_output if hasattr(output, "pooler_output") else output


@torch.inference_mode()
def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cuda = device.type == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    width = args.frame_width
    height = width * 3 // 4
    tower = build_tower("qwen2_vl", args.vision, dtype, device)
    one, one_grid = grid_inputs(1, height, width, device, dtype)
    clip, clip_grid = grid_inputs(CLIP_PATCHES, height, width, device, dtype)
    rows = one_grid.cpu()

    def eager() -> list[torch.Tensor]:
        return [pooled(tower(one, grid_thw=one_grid))]

    def kept(graphs: TowerGraphs) -> Callable[[], object]:
        """``graphs``' call on the one-patch grid, once it holds a capture checked equal to eager."""
        for _ in range(2):  # seen, then captured: its first replay must equal the eager call
            graphs.encode(one, rows, eager)
        return lambda: graphs.encode(one, rows, eager)

    # The chain (patch_embed -> blocks -> merger) run eagerly from the recorded grid inputs: how
    # much of the eager call's cost is the chain itself, and whether it reproduces the call.
    chain = TowerGraphs(
        SimpleNamespace(visual=tower), capture=lambda body, example: body, device_type=device.type
    )
    times = {
        "tower_1_patch_eager": median_ms(lambda: tower(one, grid_thw=one_grid), args.repeats, synchronize),
        "tower_1_patch_body": median_ms(kept(chain), args.repeats, synchronize),
        "tower_8_patches_eager": median_ms(
            lambda: tower(clip, grid_thw=clip_grid), args.repeats, synchronize
        ),
    }
    body_matches = chain.captures == 1 and chain.refused is None
    graph_matches = None
    if cuda:  # the chain captured in a CUDA graph, as CachedVisionModel keeps it
        graphs = TowerGraphs(SimpleNamespace(visual=tower))
        times["tower_1_patch_graph"] = median_ms(kept(graphs), args.repeats, synchronize)
        graph_matches = graphs.captures == 1 and graphs.refused is None
    frames = [
        np.random.default_rng(index).integers(0, 256, (height, width, 3), dtype=np.uint8)
        for index in range(TEMPORAL * CLIP_PATCHES)
    ]
    processor = image_processor()
    times["preprocess_2_frames"] = median_ms(
        lambda: processor(images=frames[:2], return_tensors="pt"), args.repeats, synchronize
    )
    times["preprocess_16_frames"] = median_ms(
        lambda: processor(images=frames, return_tensors="pt"), args.repeats, synchronize
    )
    times["hash_16_frames"] = median_ms(
        lambda: [blake3.blake3(f).digest() for f in frames], args.repeats, synchronize
    )
    uncached = times["tower_8_patches_eager"] + times["preprocess_16_frames"]
    rest = times["preprocess_2_frames"] + times["hash_16_frames"]
    ratios = {"turn_eager": (times["tower_1_patch_eager"] + rest) / uncached}
    if cuda:
        ratios["turn_graph"] = (times["tower_1_patch_graph"] + rest) / uncached
    return {
        "device": describe_device(device),
        "vision": args.vision,
        "dtype": args.dtype,
        "frame": f"{width}x{height}",
        "tokens_per_patch": (height // PATCH) * (width // PATCH),
        "repeats": args.repeats,
        "body_matches_eager": body_matches,
        "graph_matches_eager": graph_matches,
        "ms": times,
        "estimated_turn_ratio": ratios,
    }


def main() -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--vision", choices=("full", "tiny"), default="full" if cuda else "tiny")
    parser.add_argument("--dtype", default="bfloat16" if cuda else "float32")
    parser.add_argument("--frame-width", type=int, default=448)
    parser.add_argument("--repeats", type=int, default=20 if cuda else 3)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    torch.manual_seed(0)
    results = measure(args)
    print(f"$ python {' '.join(sys.argv)}")
    print(
        f"{results['device']} | qwen2_vl {results['vision']} tower, {results['dtype']}, "
        f"{results['frame']} frames"
    )
    for name, value in results["ms"].items():
        print(f"{name:>24}: {value:9.2f} ms")
    for name, value in results["estimated_turn_ratio"].items():
        print(f"{name:>24}: {value:9.1%} of an uncached turn (target <= 1/6 = 16.7%)")
    print(f"body == eager: {results['body_matches_eager']}; graph == eager: {results['graph_matches_eager']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    exact = results["body_matches_eager"] and results["graph_matches_eager"] is not False
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
