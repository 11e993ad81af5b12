"""Per-image cost of preprocessing, vision encoding and a visioncache hit, side by side in one run.

Builds a Qwen2-VL (or Qwen2.5-VL) vision tower with random weights and, for batches of 1, 4 and 16
distinct 1024x768 JPEG images, measures per image:

- preprocess: JPEG decode + the PIL image processor (on the host CPU);
- encode: the vision tower's forward (CUDA-synchronised on a GPU);
- hit, host: visioncache identity + lookup + copy of the cached embedding to the device (pinned
  host memory, non-blocking, synchronised) -- the embeddings live in host RAM;
- hit, device: identity + lookup of embeddings that already live on the device: a cache with
  default settings keeps a model's outputs where the model computed them, within its device budget
  (a hit returns the tensor itself, and on a GPU every byte is on the device with no spill:
  asserted), so on a GPU this is the hit a served model gets. Such a hit gives the device no work
  (torch's profiler counts 0 kernels and 0 copies in it: asserted), so it is timed without a
  device synchronize, which would time only the driver's round trip; the synchronised figure is
  printed beside it;
- hash floor: blake3 of the image bytes alone, the one step a hit cannot skip.

It prints (preprocess + encode) / hit and encode / hit, hit / floor, and the bytes per cached image.
Hits take microseconds, so they are timed over --hit-repeats calls (medians), the rest over
--repeats. Runs on a GPU (default: the 2B-class tower, bf16) and on CPU (default: a tiny tower, so
CI exercises it).

usage: python benchmarks/bench_gpu.py [--vision full|tiny] [--family qwen2_vl|qwen2_5_vl]
                                      [--counts 1,4,16] [--repeats N] [--hit-repeats N]
                                      [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import torch
from PIL import Image

from visioncache import VisionEmbeddingCache
from visioncache.bench.towers import VISION_TOWERS as TOWERS


def build_tower(family: str, size: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The vision tower alone, random weights (no download), in ``dtype`` on ``device``."""
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

        config = Qwen2VLConfig(vision_config=TOWERS[family][size]).vision_config
        tower = Qwen2VisionTransformerPretrainedModel._from_config(config)
    else:
        from transformers import Qwen2_5_VLConfig
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel,
        )

        config = Qwen2_5_VLConfig(vision_config=TOWERS[family][size]).vision_config
        tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(config)
    return tower.to(device=device, dtype=dtype).eval()


def photo_jpegs(count: int, size: tuple[int, int] = (1024, 768)) -> list[bytes]:
    """``count`` distinct JPEGs of ``size``: real photos (matplotlib, scikit-image) shifted and tinted."""
    from visioncache.bench.workload import sample_photos

    sources = [Image.fromarray(array) for _, array in sample_photos()]
    jpegs = []
    for index in range(count):
        photo = sources[index % len(sources)].convert("RGB").resize(size, Image.Resampling.BICUBIC)
        tint = np.asarray(photo, dtype=np.int16) + (index // len(sources)) * 3
        buffer = io.BytesIO()
        Image.fromarray(np.clip(tint, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
        jpegs.append(buffer.getvalue())
    return jpegs


def median_seconds(call: Callable[[], object], repeats: int, synchronize: Callable[[], None]) -> float:
    call()  # warm-up: kernels, allocator, memos
    synchronize()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        synchronize()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def image_processor() -> Any:
    """Qwen2-VL's PIL image processor (torchvision-free); older transformers: the default one."""
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    except ImportError:
        from transformers import Qwen2VLImageProcessor

        return Qwen2VLImageProcessor()
    return Qwen2VLImageProcessorPil()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    tower = build_tower(args.family, args.vision, getattr(torch, args.dtype), device)
    processor = image_processor()
    counts = {
        count: measure_count(photo_jpegs(count), tower, processor, device, args.repeats, args.hit_repeats)
        for count in args.counts
    }
    return {
        "device": describe_device(device),
        "family": args.family,
        "vision": args.vision,
        "dtype": args.dtype,
        "image_processor": type(processor).__name__,
        "repeats": args.repeats,
        "hit_repeats": args.hit_repeats,
        "counts": counts,
    }


def device_work(call: Callable[[], object]) -> int:
    """How many kernels and copies ``call`` gives the GPU (torch's profiler, CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        call()
        torch.cuda.synchronize()
    return sum(1 for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def measure_count(
    jpegs: list[bytes],
    tower: torch.nn.Module,
    processor: Any,
    device: torch.device,
    repeats: int,
    hit_repeats: int,
) -> dict[str, Any]:
    """Per-image medians for one batch of distinct images."""
    count = len(jpegs)
    dtype = next(tower.parameters()).dtype
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def preprocess() -> Any:
        images = [Image.open(io.BytesIO(jpeg)).convert("RGB") for jpeg in jpegs]
        return processor(images=images, return_tensors="pt")

    batch = preprocess()
    pixels = batch["pixel_values"].to(device=device, dtype=dtype)
    grid = batch["image_grid_thw"].to(device)

    @torch.inference_mode()
    def encode() -> torch.Tensor:
        output = tower(pixels, grid_thw=grid)
        return output.pooler_output if hasattr(output, "pooler_output") else output

    merge = tower.spatial_merge_size**2
    embeddings = encode().split((batch["image_grid_thw"].prod(-1) // merge).tolist())
    host = [e.to("cpu").pin_memory() if device.type == "cuda" else e.cpu() for e in embeddings]
    host_cache = VisionEmbeddingCache(max_embedding_bytes=None, tiers=None)
    host_cache.set_image_embeddings(jpegs, host)
    # Default settings, as a model on the GPU gets them: its outputs stay where they were computed,
    # within the embedding level's device budget (a quarter of the free device memory).
    device_cache = VisionEmbeddingCache()
    device_cache.set_image_embeddings(jpegs, list(embeddings))
    stored = device_cache.get_image_embeddings(jpegs)
    assert all(value.device == embeddings[0].device for value in stored)
    again = device_cache.get_image_embeddings(jpegs)
    assert all(a is b for a, b in zip(again, stored, strict=True))  # a hit copies nothing

    def hit_host() -> list[torch.Tensor]:
        return [value.to(device, non_blocking=True) for value in host_cache.get_image_embeddings(jpegs)]

    def hit_device() -> list[torch.Tensor]:
        return device_cache.get_image_embeddings(jpegs)

    def hash_floor() -> list[bytes]:
        return [blake3.blake3(jpeg).digest() for jpeg in jpegs]

    def no_sync() -> None:
        return None

    # A device hit must give the GPU nothing to do; then a synchronize after it times only the driver.
    hit_device_work = device_work(hit_device) if device.type == "cuda" else 0
    assert hit_device_work == 0, f"a device hit launched {hit_device_work} kernels or copies"
    times = {
        "preprocess": median_seconds(preprocess, repeats, synchronize) / count,
        "encode": median_seconds(encode, repeats, synchronize) / count,
        "hit_host": median_seconds(hit_host, hit_repeats, synchronize) / count,
        "hit_device": median_seconds(hit_device, hit_repeats, no_sync) / count,
        "hit_device_synchronised": median_seconds(hit_device, hit_repeats, synchronize) / count,
        "hash_floor": median_seconds(hash_floor, hit_repeats, no_sync) / count,
    }
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(hit_host(), embeddings, strict=True))
    level = device_cache.snapshot().levels["embedding"]
    if device.type == "cuda":  # every hit was the tensor itself: nothing spilled, all on the device
        assert (level.device_bytes, level.spills) == (level.bytes, 0), level
    work = times["preprocess"] + times["encode"]
    return {
        **{f"{name}_ms_per_image": seconds * 1e3 for name, seconds in times.items()},
        "bytes_per_image": sum(e.nbytes for e in embeddings) // count,
        "device_cache_device_bytes": level.device_bytes,
        "device_cache_host_bytes": level.host_bytes,
        "device_cache_spills": level.spills,
        "jpeg_bytes_per_image": sum(map(len, jpegs)) // count,
        "tokens_per_image": embeddings[0].shape[0],
        "ratio_preprocess_plus_encode_over_hit_host": work / times["hit_host"],
        "ratio_encode_over_hit_host": times["encode"] / times["hit_host"],
        "ratio_preprocess_plus_encode_over_hit_device": work / times["hit_device"],
        "ratio_preprocess_plus_encode_over_hit_device_synchronised": work / times["hit_device_synchronised"],
        "ratio_hit_device_over_hash_floor": times["hit_device"] / times["hash_floor"],
        "hit_device_gpu_work": hit_device_work,
    }


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    threads = torch.get_num_threads()
    return f"CPU {platform.processor() or platform.machine()}, {threads} threads, torch {torch.__version__}"


def print_report(results: dict[str, Any], command: str) -> None:
    print(f"$ {command}")
    print(
        f"{results['device']} | {results['family']} {results['vision']} tower, {results['dtype']}, "
        f"{results['image_processor']}"
    )
    header = (
        "images",
        "preprocess",
        "encode",
        "hit (host->dev)",
        "hit (on dev)",
        "(pre+enc)/hit",
        "enc/hit",
        "(pre+enc)/hit on dev",
        "hash floor",
        "hit on dev/floor",
        "MB/image",
    )
    rows = [header]
    for count, row in results["counts"].items():
        rows.append(
            (
                str(count),
                f"{row['preprocess_ms_per_image']:.2f} ms",
                f"{row['encode_ms_per_image']:.2f} ms",
                f"{row['hit_host_ms_per_image']:.3f} ms",
                f"{row['hit_device_ms_per_image']:.3f} ms",
                f"{row['ratio_preprocess_plus_encode_over_hit_host']:,.0f}x",
                f"{row['ratio_encode_over_hit_host']:,.0f}x",
                f"{row['ratio_preprocess_plus_encode_over_hit_device']:,.0f}x",
                f"{row['hash_floor_ms_per_image']:.3f} ms",
                f"{row['ratio_hit_device_over_hash_floor']:.2f}x",
                f"{row['bytes_per_image'] / 1e6:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    print(
        f"per image; medians of {results['repeats']} calls ({results['hit_repeats']} for hits, floor); "
        "target (pre+enc)/hit >= 200x from host, >= 2,000x on the device"
    )
    for count, row in results["counts"].items():
        print(
            f"default cache, {count} images: {row['device_cache_device_bytes'] / 1e6:.2f} MB on the device, "
            f"{row['device_cache_host_bytes'] / 1e6:.2f} MB on the host, "
            f"{row['device_cache_spills']} spills; "
            f"a device hit gave the GPU {row['hit_device_gpu_work']} kernels or copies; with a synchronize "
            f"after it: {row['hit_device_synchronised_ms_per_image']:.3f} ms, "
            f"(pre+enc)/hit {row['ratio_preprocess_plus_encode_over_hit_device_synchronised']:,.0f}x"
        )


def main() -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--vision", choices=("full", "tiny"), default="full" if cuda else "tiny")
    parser.add_argument("--family", choices=tuple(TOWERS), default="qwen2_vl")
    parser.add_argument("--dtype", default="bfloat16" if cuda else "float32")
    parser.add_argument(
        "--counts",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 4, 16] if cuda else [1, 4],
    )
    parser.add_argument("--repeats", type=int, default=10 if cuda else 3)
    parser.add_argument("--hit-repeats", type=int, default=500 if cuda else 50)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    torch.manual_seed(0)
    results = measure(args)
    print_report(results, " ".join(["python", *sys.argv]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
