"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL (``bench.models``) and Qwen3.5 offline models."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from visioncache.bench.family_models.checkpoints import CHECKPOINTS
from visioncache.bench.family_models.spec import TINY_TEXT, FamilyModel
from visioncache.bench.models import build_offline_model
from visioncache.bench.offline import image_only_processor, token_id, tower
from visioncache.bench.vocabulary import IMAGE_PLACEHOLDER, build_tokenizer

__all__ = ["qwen2_5_vl", "qwen2_vl", "qwen3_5", "qwen3_vl", "qwen_vl"]


def qwen_vl(family: str, vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    model, processor = build_offline_model(family, vision, dtype, seed)
    return FamilyModel(family, model, processor, IMAGE_PLACEHOLDER)


def qwen2_vl(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    return qwen_vl("qwen2_vl", vision, dtype, seed)


def qwen2_5_vl(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    return qwen_vl("qwen2_5_vl", vision, dtype, seed)


def qwen3_vl(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    return qwen_vl("qwen3_vl", vision, dtype, seed)


def qwen3_5(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    """Qwen3.5: Qwen3-VL's processor, a Qwen3-VL-like tower without deepstack, and a language
    model of gated delta-net (linear attention) and full-attention layers."""
    tokenizer = build_tokenizer()

    def ids(token: str) -> int:
        return token_id(tokenizer, token)

    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    config = Qwen3_5Config(
        text_config={
            **TINY_TEXT,
            "head_dim": 16,
            "vocab_size": len(tokenizer),
            "pad_token_id": ids("<|endoftext|>"),
            "eos_token_id": ids("<|endoftext|>"),
            "layer_types": ["linear_attention", "full_attention"],
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "rope_parameters": {**rope, "partial_rotary_factor": 1.0},
        },
        vision_config=tower("qwen3_5", vision),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    torch.manual_seed(seed)
    model: Any = Qwen3_5ForConditionalGeneration(config)
    model = model.to(dtype).eval()
    image_processor = Qwen2VLImageProcessorPil(**CHECKPOINTS["qwen3_5"].image_processor)
    processor = image_only_processor(Qwen3VLProcessor, image_processor=image_processor, tokenizer=tokenizer)
    return FamilyModel("qwen3_5", model, processor, IMAGE_PLACEHOLDER)
