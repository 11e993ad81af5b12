"""The Gemma families' tiny checkpoints (`tests.support.mlx_families` builds them).

- **Gemma 4**, as E2B/E4B: a sliding-window and a global layer (a 512-token window), per-layer
  inputs, image tokens attending each other both ways (``use_bidirectional_attention="vision"``),
  a tower pooled 2 x 2 whose soft-token count per image follows its aspect ratio (at most 16).
- **Gemma 3**: refused by visioncache serve-mlx (stock vllm-mlx fails its image requests); the
  tests use it to check the refusal.
"""

from __future__ import annotations

from typing import Any

from tests.support.mlx_tiny_family import TINY_TEXT, TinyFamily

__all__ = ["GEMMA_FAMILIES"]


def _gemma_template(image_marker: str, bos: str, start: str, end: str, model_role: str) -> str:
    return (
        f"{{{{ {bos!r} }}}}{{% for message in messages %}}{start}"
        f"{{{{ {model_role!r} if message['role'] == 'assistant' else message['role'] }}}}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for item in message['content'] %}"
        f"{{% if item['type'] == 'image' or 'image_url' in item %}}{image_marker}"
        "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
        f"{end}\n{{% endfor %}}{{% if add_generation_prompt %}}{start}{model_role}\n{{% endif %}}"
    )


_GEMMA3_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)


def _gemma3_config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
    text = {
        "model_type": "gemma3_text",
        **TINY_TEXT,
        "vocab_size": vocab,
        "query_pre_attn_scalar": 16,
        "sliding_window": 64,
        "sliding_window_pattern": 2,
        "mm_tokens_per_image": 16,
    }
    vision = {
        "model_type": "siglip_vision_model",
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "patch_size": 8,
        "image_size": 64,
    }
    return {
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": vision,
        "vocab_size": vocab,
        "hidden_size": 64,
        "mm_tokens_per_image": 16,
        "image_token_index": ids["<image_soft_token>"],
        "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]],
        "pad_token_id": ids["<pad>"],
    }


_GEMMA4_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<|turn>",
    "<turn|>",
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
)
# The processor's image settings: up to 16 soft tokens per image (pooled 2 x 2 from 8-pixel patches).
_GEMMA4_IMAGES = {"patch_size": 8, "max_soft_tokens": 16, "pooling_kernel_size": 2}


def _gemma4_config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
    """Gemma 4 as E2B/E4B: a sliding-window and a global layer (512-token window), per-layer
    inputs, image tokens attending each other both ways; a SigLIP-like tower, pooled 2 x 2."""
    text = {
        "model_type": "gemma4_text",
        **TINY_TEXT,
        "global_head_dim": 32,
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "hidden_size_per_layer_input": 16,
        "num_kv_shared_layers": 0,
        "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention"],
        "use_bidirectional_attention": "vision",
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    }
    vision = {
        "model_type": "gemma4_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
        "patch_size": _GEMMA4_IMAGES["patch_size"],
        "pooling_kernel_size": _GEMMA4_IMAGES["pooling_kernel_size"],
        "position_embedding_size": 64,
        "default_output_length": _GEMMA4_IMAGES["max_soft_tokens"],
    }
    return {
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": vision,
        "vocab_size": vocab,
        "hidden_size": 64,
        "image_token_id": ids["<|image|>"],
        "boi_token_id": ids["<|image>"],
        "eoi_token_id": ids["<image|>"],
        "audio_token_id": ids["<|audio|>"],
        "boa_token_id": ids["<|audio>"],
        "eoa_token_id": ids["<audio|>"],
        "vision_soft_tokens_per_image": _GEMMA4_IMAGES["max_soft_tokens"],
        "pad_token_id": ids["<pad>"],
    }


GEMMA_FAMILIES: dict[str, TinyFamily] = {
    "gemma4": TinyFamily(
        model_type="gemma4",
        special_tokens=_GEMMA4_TOKENS,
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        chat_template=_gemma_template("<|image|>", "<bos>", "<|turn>", "<turn|>", "model"),
        config=_gemma4_config,
        files={
            "processor_config.json": {
                "processor_class": "Gemma4Processor",
                "image_processor": {"image_processor_type": "Gemma4ImageProcessor", **_GEMMA4_IMAGES},
            }
        },
        stop_tokens=("<turn|>",),
        media_tokens=("<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>"),
        tokenizer_attributes={
            "image_token": "<|image|>",
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
        },
    ),
    # Refused by visioncache serve-mlx (the tests check the refusal).
    "gemma3": TinyFamily(
        model_type="gemma3",
        special_tokens=_GEMMA3_TOKENS,
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        chat_template=_gemma_template(
            "<start_of_image>", "<bos>", "<start_of_turn>", "<end_of_turn>", "model"
        ),
        config=_gemma3_config,
        files={
            "preprocessor_config.json": {
                "image_processor_type": "Gemma3ImageProcessor",
                "processor_class": "Gemma3Processor",
                "size": {"height": 64, "width": 64},
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            },
            "processor_config.json": {"processor_class": "Gemma3Processor", "image_seq_length": 16},
        },
        stop_tokens=("<end_of_turn>",),
        tokenizer_attributes={
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        },
    ),
}
