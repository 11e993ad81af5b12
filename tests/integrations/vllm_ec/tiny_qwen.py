"""Tiny random-weight Qwen2.5-VL and Qwen3-VL checkpoints (the Qwen2-VL one: `tiny_model`).

The same tokenizer, chat template and text sizes as the Qwen2-VL model; what differs is each
family's vision tower: Qwen2.5-VL's windowed attention with full-attention blocks, Qwen3-VL's
16-pixel patches, learned position embeddings and deepstack features (its encoder output rows
carry the deepstack layers' features too: 3x wider here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from tests.integrations.vllm_ec.tiny_model import CHAT_TEMPLATE, build_tokenizer, save_checkpoint
from visioncache.bench.vocabulary import SPECIAL_TOKENS

__all__ = ["save_tiny_qwen2_5_vl", "save_tiny_qwen3_vl"]

DTYPE = torch.bfloat16


def _text_config(tokenizer: Any, **extra: Any) -> dict[str, Any]:
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 256,
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 4096,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "torch_dtype": "bfloat16",
        **extra,
    }


def _token_ids(tokenizer: Any) -> dict[str, int]:
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


def save_tiny_qwen2_5_vl(directory: Path, *, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]}
    config = Qwen2_5_VLConfig(
        vision_config={
            "depth": 2,
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_heads": 4,
            "out_hidden_size": 128,
            "fullatt_block_indexes": [1],
            "window_size": 112,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        text_config=_text_config(tokenizer, rope_parameters=rope),
        torch_dtype="bfloat16",
        **_token_ids(tokenizer),
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=224 * 224),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    return save_checkpoint(directory, Qwen2_5_VLForConditionalGeneration(config), processor, DTYPE)


def save_tiny_qwen3_vl(directory: Path, *, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    rope = {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [4, 6, 6], "mrope_interleaved": True}
    config = Qwen3VLConfig(
        vision_config={
            "depth": 3,
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_heads": 4,
            "out_hidden_size": 128,
            "deepstack_visual_indexes": [0, 1],
            "num_position_embeddings": 256,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        text_config=_text_config(tokenizer, head_dim=32, rope_parameters=rope),
        torch_dtype="bfloat16",
        **_token_ids(tokenizer),
    )
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, min_pixels=64 * 64, max_pixels=256 * 256),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    return save_checkpoint(directory, Qwen3VLForConditionalGeneration(config), processor, DTYPE)
