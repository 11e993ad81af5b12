"""The Gemma families' tiny checkpoints (`tests.support.mlx_families` builds them).

- **Gemma 4**, as E2B/E4B: a sliding-window and a global layer (a 512-token window), per-layer
  inputs, image tokens attending each other both ways (``use_bidirectional_attention="vision"``),
  a tower pooled 2 x 2 whose soft-token count per image follows its aspect ratio (at most 16).
- **Gemma 3**, as gemma-3-4b-it: five sliding-window layers (a 1024-token window) and a global
  one, a SigLIP tower at 896 px in 14 px patches pooled to 256 soft tokens per image, Gemma 3's
  processor and template (pan-and-scan off, as released).
- **PaliGemma**, as paligemma-3b-mix-224: a SigLIP tower at 224 px in 14 px patches (256 image
  tokens), a gemma language model attending the whole prompt both ways; a chat template of its
  processor's layout (the checkpoints ship none).

Stock vllm-mlx 0.6.0 fails every image request of both (tests/integrations/vllm_mlx/
test_vllm_mlx_beyond_stock.py records how); Gemma 4 it serves.
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
    """Gemma 3 as gemma-3-4b-it: five sliding-window layers (a 1024-token window) then a global
    one, linear RoPE scaling on the global layers; a SigLIP tower at 896 px in 14 px patches,
    pooled 4 x 4 to 256 soft tokens per image."""
    text = {
        "model_type": "gemma3_text",
        **TINY_TEXT,
        "num_hidden_layers": 6,
        "vocab_size": vocab,
        "query_pre_attn_scalar": TINY_TEXT["head_dim"],  # the head width, as in 4B
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "rope_global_base_freq": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "max_position_embeddings": 131072,
        "mm_tokens_per_image": 256,
    }
    # One narrow layer: its 4096 patches per image take seconds through a wider one on mlx-cpu.
    vision = {
        "model_type": "siglip_vision_model",
        "num_hidden_layers": 1,
        "hidden_size": 16,  # at least the patch size: mlx-vlm's weight sanitizer reads a narrower
        "intermediate_size": 32,  # patch convolution as torch's layout
        "num_attention_heads": 1,
        "patch_size": 14,
        "image_size": 896,
    }
    return {
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": vision,
        "vocab_size": vocab,
        "hidden_size": 64,
        "mm_tokens_per_image": 256,
        "image_token_index": ids["<image_soft_token>"],
        "boi_token_index": ids["<start_of_image>"],
        "eoi_token_index": ids["<end_of_image>"],
        "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]],
        "pad_token_id": ids["<pad>"],
    }


# Gemma 3's template: the system message opens the first user turn; images are <start_of_image>.
_GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\\n\\n' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' or 'image_url' in item %}"
    "{{ '<start_of_image>' }}{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

_PALIGEMMA_TOKENS = ("<pad>", "<eos>", "<bos>", "<image>")


def _paligemma_config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
    """PaliGemma as paligemma-3b-mix-224: a SigLIP tower at 224 px in 14 px patches (256 image
    tokens), projected to the gemma language model's width; one key-value head."""
    text = {
        "model_type": "gemma",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "num_image_tokens": 256,
        "vocab_size": vocab,
    }
    vision = {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "num_image_tokens": 256,
        "patch_size": 14,
        "image_size": 224,
        "projection_dim": 64,
    }
    return {
        "model_type": "paligemma",
        "text_config": text,
        "vision_config": vision,
        "vocab_size": vocab,
        "hidden_size": 64,
        "projection_dim": 64,
        "image_token_index": ids["<image>"],
        "bos_token_id": ids["<bos>"],
        "eos_token_id": ids["<eos>"],
        "pad_token_id": ids["<pad>"],
    }


# PaliGemma checkpoints ship no chat template; this one writes a chat in the layout its processor
# gives a prompt: the images' <image> markers first, then the text, one line per message.
_PALIGEMMA_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is not string %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' or 'image_url' in item %}"
    "{{ '<image>' }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
)


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
    "gemma3": TinyFamily(
        model_type="gemma3",
        special_tokens=_GEMMA3_TOKENS,
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        chat_template=_GEMMA3_TEMPLATE,
        config=_gemma3_config,
        files={
            "preprocessor_config.json": {
                "image_processor_type": "Gemma3ImageProcessor",
                "processor_class": "Gemma3Processor",
                "do_normalize": True,
                "do_pan_and_scan": None,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "image_seq_length": 256,
                "resample": 2,
                "rescale_factor": 1 / 255,
                "size": {"height": 896, "width": 896},
            },
            "processor_config.json": {"processor_class": "Gemma3Processor", "image_seq_length": 256},
        },
        stop_tokens=("<end_of_turn>",),
        media_tokens=("<start_of_image>", "<end_of_image>", "<image_soft_token>"),
        tokenizer_attributes={
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        },
    ),
    "paligemma": TinyFamily(
        model_type="paligemma",
        special_tokens=_PALIGEMMA_TOKENS,
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        chat_template=_PALIGEMMA_TEMPLATE,
        config=_paligemma_config,
        files={
            "preprocessor_config.json": {
                "image_processor_type": "SiglipImageProcessor",
                "processor_class": "PaliGemmaProcessor",
                "do_normalize": True,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "image_seq_length": 256,
                "resample": 3,
                "rescale_factor": 1 / 255,
                "size": {"height": 224, "width": 224},
            },
        },
        media_tokens=("<image>",),
        tokenizer_attributes={"image_token": "<image>"},
    ),
}
