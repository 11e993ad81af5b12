"""The random-weight vision towers the bench builds, by model family and size: configs as data.

``tiny`` is fast on a CPU (tests, ``visioncache bench``); ``full`` is a released checkpoint's
tower (named beside it), the cost the embedding cache saves. Only widths and depths differ: the
image geometry (image and patch sizes, merges, position tables) is the family's published
checkpoint's (``family_models/checkpoints.py``), which ``offline.tower`` lays over these.
``benchmarks/bench_gpu.py`` builds the Qwen towers alone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VISION_TOWERS"]

# A narrow two-layer SigLIP-style tower: the tiny tower of most families.
_TINY_TILE: dict[str, Any] = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
)
# SigLIP so400m (Gemma 3, LLaVA-OneVision and Idefics3 use it at 896, 384 and 364 pixels).
_SO400M: dict[str, Any] = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16
)
# InternViT-300M and Pixtral's tower share these sizes.
_VIT_300M: dict[str, Any] = dict(
    hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16
)

VISION_TOWERS: dict[str, dict[str, dict[str, Any]]] = {
    "qwen2_vl": {
        "tiny": dict(depth=2, embed_dim=64, num_heads=4, hidden_size=64, mlp_ratio=4),
        # Qwen2-VL-2B's vision tower
        "full": dict(depth=32, embed_dim=1280, num_heads=16, hidden_size=1536, mlp_ratio=4),
    },
    "qwen2_5_vl": {
        "tiny": dict(
            depth=4,
            hidden_size=64,
            intermediate_size=128,
            num_heads=4,
            out_hidden_size=64,
            fullatt_block_indexes=[1, 3],
            window_size=112,
        ),
        "full": dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=1536,
            fullatt_block_indexes=[7, 15, 23, 31],
            window_size=112,
        ),
    },
    "qwen3_vl": {
        "tiny": dict(
            depth=3,
            hidden_size=64,
            intermediate_size=128,
            num_heads=4,
            out_hidden_size=64,
            deepstack_visual_indexes=[0, 1],
        ),
    },
    "qwen3_5": {
        "tiny": dict(
            depth=2,
            hidden_size=32,
            num_heads=4,
            intermediate_size=64,
            out_hidden_size=64,
        ),
    },
    "glm4v": {
        "tiny": dict(
            depth=2,
            hidden_size=32,
            num_heads=4,
            intermediate_size=64,
            out_hidden_size=64,
        ),
        # GLM-4.1V-9B's tower (transformers' Glm4vVisionConfig defaults)
        "full": dict(
            depth=24,
            hidden_size=1536,
            num_heads=12,
            intermediate_size=13696,
            out_hidden_size=4096,  # the MLP width too
        ),
    },
    "gemma3": {
        "tiny": _TINY_TILE,
        "full": _SO400M,  # Gemma 3 4B-27B
    },
    "gemma4": {
        "tiny": {
            **_TINY_TILE,
            "num_key_value_heads": 4,
            "head_dim": 8,
        }
    },
    "mistral3": {
        "tiny": {**_TINY_TILE, "head_dim": 8},
        "full": {**_VIT_300M, "head_dim": 64},  # Mistral Small 3.1
    },
    "internvl": {"tiny": _TINY_TILE, "full": _VIT_300M},  # InternViT-300M-448px
    "llava_onevision": {"tiny": _TINY_TILE, "full": {**_SO400M, "num_hidden_layers": 26}},
    "idefics3": {"tiny": _TINY_TILE, "full": _SO400M},  # Idefics3-8B
    "smolvlm": {"tiny": _TINY_TILE},
}
