"""The random-weight vision towers the bench builds, by model family and size: configs as data.

``tiny`` is fast on a CPU (tests, ``visioncache bench``); ``full`` is the 2B-class tower, the cost
the embedding cache saves. ``benchmarks/bench_gpu.py`` builds the same towers alone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VISION_TOWERS"]

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
            num_position_embeddings=2304,
        ),
    },
}
