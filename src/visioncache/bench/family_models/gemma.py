"""Gemma 3 and Gemma 4 offline models: SigLIP-style towers at the published checkpoints' image
geometry (Gemma 3: 896 pixels, 256 soft tokens; Gemma 4: up to 280 soft tokens)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

from visioncache.bench.family_models.checkpoints import CHECKPOINTS
from visioncache.bench.family_models.spec import TINY_TEXT, FamilyModel
from visioncache.bench.offline import (
    image_only_processor,
    random_model,
    token_id,
    tower,
)
from visioncache.bench.vocabulary import WORDS, build_tokenizer

__all__ = ["gemma3", "gemma4"]

_TURNS = ("<bos>", "<start_of_turn>", "<end_of_turn>")


def _text(tokenizer: Any, **extra: Any) -> dict[str, Any]:
    return {
        **TINY_TEXT,
        "head_dim": 16,
        "vocab_size": len(tokenizer),
        "sliding_window": 16,
        "pad_token_id": token_id(tokenizer, "<pad>"),
        "eos_token_id": token_id(tokenizer, "<eos>"),
        "bos_token_id": token_id(tokenizer, "<bos>"),
        **extra,
    }


def gemma3(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    """Gemma 3: 256 soft tokens per image, SigLIP's 64x64 patches of a 896-pixel square pooled 4x4;
    pan-and-scan off, as the processor's default."""
    vision_config = tower("gemma3", vision)
    checkpoint = CHECKPOINTS["gemma3"]
    named = {
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
    }
    tokenizer = build_tokenizer(WORDS, _TURNS, named, eos="<eos>", pad="<pad>")
    config = Gemma3Config(
        text_config=_text(tokenizer, query_pre_attn_scalar=16),
        vision_config=vision_config,
        **checkpoint.config,
        boi_token_index=token_id(tokenizer, "<start_of_image>"),
        eoi_token_index=token_id(tokenizer, "<end_of_image>"),
        image_token_index=token_id(tokenizer, "<image_soft_token>"),
    )
    model = random_model(Gemma3ForConditionalGeneration, config, dtype, seed)
    image_processor = Gemma3ImageProcessorPil(**checkpoint.image_processor)
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, **checkpoint.processor)
    return FamilyModel("gemma3", model, processor, "<start_of_image>")


def gemma4(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    """Gemma 4: up to 280 soft tokens per image (16-pixel patches pooled 3x3), by its size.

    Imported here: before transformers 5.21, Gemma4Processor's module imports torchvision."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4Processor
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    named = {
        "boi_token": "<|image>",
        "eoi_token": "<image|>",
        "image_token": "<|image|>",
        "boa_token": "<|audio>",
        "eoa_token": "<audio|>",
        "audio_token": "<|audio|>",
    }
    tokenizer = build_tokenizer(WORDS, (*_TURNS, "<|video|>"), named, eos="<eos>", pad="<pad>")
    config = Gemma4Config(
        text_config=_text(
            tokenizer,
            vocab_size_per_layer_input=len(tokenizer),
            hidden_size_per_layer_input=8,
            layer_types=["sliding_attention", "full_attention"],
        ),
        vision_config=tower("gemma4", vision),
        audio_config=None,
        boi_token_id=token_id(tokenizer, "<|image>"),
        eoi_token_id=token_id(tokenizer, "<image|>"),
        image_token_id=token_id(tokenizer, "<|image|>"),
        video_token_id=token_id(tokenizer, "<|video|>"),
    )
    model = random_model(Gemma4ForConditionalGeneration, config, dtype, seed)
    checkpoint = CHECKPOINTS["gemma4"]
    image_processor = Gemma4ImageProcessorPil(**checkpoint.image_processor)
    processor = image_only_processor(
        Gemma4Processor,
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=image_processor,
        tokenizer=tokenizer,
        **checkpoint.processor,
    )
    return FamilyModel("gemma4", model, processor, "<|image|>")
