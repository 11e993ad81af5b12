"""The processing settings of a published checkpoint of each family, which its tiny model keeps.

Why: an image takes another code path at another setting (anyres grids, tile counts, image
splitting, soft tokens per image, resize bounds), so a test on a model with settings of its own
proves nothing about a real checkpoint. Each family's offline model (tiny or full) keeps all of
these and shrinks only widths and depths (``bench/towers.py``). Values are the checkpoint's
``preprocessor_config.json`` / ``processor_config.json`` / ``config.json``; where it publishes none
for a setting, the transformers class default it loads with (named ``class default``).
``tests/integrations/test_transformers_family_settings.py`` checks every built model against this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHECKPOINTS", "Checkpoint"]

_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
_HALF = [0.5, 0.5, 0.5]
_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]
# LlavaOnevisionImageProcessor's class default, as in llava-onevision-qwen2-0.5b-ov-hf: every
# rows x columns grid of 384-pixel patches up to 6 x 6.
_ANYRES_384 = [[384 * rows, 384 * cols] for rows in range(1, 7) for cols in range(1, 7)]


@dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint's processing settings.

    ``image_processor``: attributes of the image processor (its preprocessor config);
    ``processor``: attributes of the processor; ``config``: attributes of the model config and,
    under ``vision_config``, of its tower config (image geometry only, never widths).
    """

    name: str
    image_processor: dict[str, Any]
    processor: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    vision: dict[str, Any] = field(default_factory=dict)


def _qwen2(name: str) -> Checkpoint:
    return Checkpoint(
        name,
        {
            "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16384},  # min/max_pixels
            "patch_size": 14,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "image_mean": _CLIP_MEAN,
            "image_std": _CLIP_STD,
        },
        vision={"patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2},
    )


def _qwen3(name: str) -> Checkpoint:
    return Checkpoint(
        name,
        {
            "size": {"shortest_edge": 65536, "longest_edge": 16777216},
            "patch_size": 16,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "image_mean": _HALF,
            "image_std": _HALF,
        },
        vision={
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "num_position_embeddings": 2304,
        },
    )


_QWEN2_5 = _qwen2("Qwen/Qwen2.5-VL-3B-Instruct")
_IDEFICS3_TILE = 364

CHECKPOINTS: dict[str, Checkpoint] = {
    "qwen2_vl": _qwen2("Qwen/Qwen2-VL-2B-Instruct"),
    "qwen2_5_vl": Checkpoint(
        _QWEN2_5.name, _QWEN2_5.image_processor, vision={**_QWEN2_5.vision, "window_size": 112}
    ),
    "qwen3_vl": _qwen3("Qwen/Qwen3-VL-2B-Instruct"),
    "qwen3_5": _qwen3("Qwen/Qwen3.5 (Qwen3-VL's preprocessor configuration)"),
    "glm4v": Checkpoint(
        "zai-org/GLM-4.1V-9B-Thinking",
        {
            "size": {"shortest_edge": 12544, "longest_edge": 9633792},
            "patch_size": 14,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "image_mean": _CLIP_MEAN,
            "image_std": _CLIP_STD,
        },
        vision={"patch_size": 14, "image_size": 336, "temporal_patch_size": 2, "spatial_merge_size": 2},
    ),
    "gemma3": Checkpoint(
        "google/gemma-3-4b-it",
        {"size": {"height": 896, "width": 896}, "resample": 2, "image_mean": _HALF, "image_std": _HALF},
        # Gemma3ProcessorKwargs' defaults: pan-and-scan off (the checkpoint's do_pan_and_scan is null).
        processor={"image_seq_length": 256},
        config={"mm_tokens_per_image": 256},
        vision={"image_size": 896, "patch_size": 14},
    ),
    "gemma4": Checkpoint(
        "Gemma 4 (class defaults: Gemma4ImageProcessor, Gemma4Processor, Gemma4VisionConfig)",
        {"patch_size": 16, "max_soft_tokens": 280, "pooling_kernel_size": 3, "do_normalize": False},
        processor={"image_seq_length": 280},
        vision={"patch_size": 16, "pooling_kernel_size": 3, "position_embedding_size": 10 * 1024},
    ),
    "mistral3": Checkpoint(
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        {
            "size": {"longest_edge": 1540},
            "patch_size": {"height": 14, "width": 14},
            "image_mean": _CLIP_MEAN,
            "image_std": _CLIP_STD,
        },
        processor={"patch_size": 14, "spatial_merge_size": 2},
        config={"spatial_merge_size": 2, "vision_feature_layer": -1},
        vision={"image_size": 1540, "patch_size": 14},
    ),
    "llava_onevision": Checkpoint(
        "llava-hf/llava-onevision-qwen2-0.5b-ov-hf",
        {
            "size": {"height": 384, "width": 384},
            "image_grid_pinpoints": _ANYRES_384,
            "image_mean": _HALF,
            "image_std": _HALF,
        },
        processor={"num_image_tokens": 729, "vision_feature_select_strategy": "full"},
        config={
            "image_grid_pinpoints": _ANYRES_384,
            "vision_feature_select_strategy": "full",
            "vision_feature_layer": -1,
            "vision_aspect_ratio": "anyres_max_9",
        },
        vision={"image_size": 384, "patch_size": 14},
    ),
    "internvl": Checkpoint(
        "OpenGVLab/InternVL3-1B-hf",
        {
            "size": {"height": 448, "width": 448},
            "min_patches": 1,
            "max_patches": 12,  # dynamic tiling: InternVLProcessorKwargs' crop_to_patches=True
            "image_mean": _IMAGENET_MEAN,
            "image_std": _IMAGENET_STD,
        },
        processor={"image_seq_length": 256},
        config={"image_seq_length": 256, "downsample_ratio": 0.5},
        vision={"image_size": [448, 448], "patch_size": [14, 14]},
    ),
    "idefics3": Checkpoint(
        "HuggingFaceM4/Idefics3-8B-Llama3",
        {
            "size": {"longest_edge": 4 * _IDEFICS3_TILE},
            "max_image_size": {"longest_edge": _IDEFICS3_TILE},
            "do_image_splitting": True,
            "resample": 1,
            "image_mean": _HALF,
            "image_std": _HALF,
        },
        processor={"image_seq_len": 169},
        config={"scale_factor": 2},
        vision={"image_size": _IDEFICS3_TILE, "patch_size": 14},
    ),
    "smolvlm": Checkpoint(
        "HuggingFaceTB/SmolVLM2-256M-Video-Instruct",
        {
            "size": {"longest_edge": 2048},
            "max_image_size": {"longest_edge": 512},
            "do_image_splitting": True,
            "resample": 1,
            "image_mean": _HALF,
            "image_std": _HALF,
        },
        processor={"image_seq_len": 64},
        config={"scale_factor": 4},
        vision={"image_size": 512, "patch_size": 16},
    ),
}
