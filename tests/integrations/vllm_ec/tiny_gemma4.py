"""A tiny random-weight Gemma 4 checkpoint on Gemma 4's own processing settings (the processor
classes' defaults): 16-pixel patches pooled 3x3, images resized to at most 280 soft tokens (an
aspect-preserving patch grid), which sit between ``<|image>`` and ``<image|>``.

Only widths and depths shrink: vision 2 blocks of 128, text 2 layers (one sliding, one full) of
128; head_dim 32 in both (vLLM's CPU attention needs 32-512). No audio tower.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4ImageProcessor,
    Gemma4Processor,
    Gemma4VideoProcessor,
)
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

from tests.integrations.vllm_ec.tiny_model import save_checkpoint
from visioncache.bench.offline import randomize_constant_parameters, token_id
from visioncache.bench.vocabulary import WORDS, build_tokenizer

__all__ = ["save_tiny_gemma4"]

_NAMED = {
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "image_token": "<|image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "audio_token": "<|audio|>",
    "video_token": "<|video|>",
}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|turn> "
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }} "
    "{% if message['content'] is string %}{{ message['content'] }} {% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }} "
    "{% elif part['type'] in ('image', 'image_url') %}<|image|> "
    "{% endif %}{% endfor %}{% endif %}<turn|> {% endfor %}"
    "{% if add_generation_prompt %}<|turn> model {% endif %}"
)


def save_tiny_gemma4(directory: Path, *, seed: int = 0) -> Path:
    tokenizer: Any = build_tokenizer(
        WORDS, ("<bos>", "<|turn>", "<turn|>", "model"), _NAMED, eos="<eos>", pad="<pad>"
    )
    tokenizer.add_special_tokens({"bos_token": "<bos>"})
    tokenizer.chat_template = CHAT_TEMPLATE
    image_processor = Gemma4ImageProcessor()  # 16-px patches, pooling 3, 280 soft tokens at most
    config = Gemma4Config(
        text_config={
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "global_head_dim": 32,
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 512,
            "vocab_size": len(tokenizer),
            "vocab_size_per_layer_input": len(tokenizer),
            "hidden_size_per_layer_input": 8,
            "max_position_embeddings": 32768,
            "pad_token_id": token_id(tokenizer, "<pad>"),
            "eos_token_id": token_id(tokenizer, "<eos>"),
            "bos_token_id": token_id(tokenizer, "<bos>"),
        },
        vision_config={
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 32,
            "patch_size": image_processor.patch_size,
            "pooling_kernel_size": image_processor.pooling_kernel_size,
            # The published checkpoints' config carries it (vLLM 0.32 reads it); transformers
            # 5.19's config class no longer declares it.
            "default_output_length": image_processor.max_soft_tokens,
        },
        audio_config=None,
        boi_token_id=token_id(tokenizer, "<|image>"),
        eoi_token_id=token_id(tokenizer, "<image|>"),
        image_token_id=token_id(tokenizer, "<|image|>"),
        video_token_id=token_id(tokenizer, "<|video|>"),
        boa_token_id=token_id(tokenizer, "<|audio>"),
        eoa_token_index=token_id(tokenizer, "<audio|>"),
        audio_token_id=token_id(tokenizer, "<|audio|>"),
        torch_dtype="bfloat16",
    )
    processor = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(),
        chat_template=CHAT_TEMPLATE,
        image_seq_length=image_processor.max_soft_tokens,
    )
    torch.manual_seed(seed)
    model = randomize_constant_parameters(Gemma4ForConditionalGeneration(config), seed)
    return save_checkpoint(directory, model, processor, torch.bfloat16)
