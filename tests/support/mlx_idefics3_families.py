"""The Idefics3 and SmolVLM (SmolVLM2 layout) tiny checkpoints (`tests.support.mlx_families`
builds them): 64 px tiles of 16 px patches, pixel-shuffled 2 x 2 (4 tokens a tile), up to 2 x 2
tiles and the global view per image, a llama language model (1-D RoPE).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.mlx_tiny_family import TinyFamily

__all__ = ["IDEFICS3_FAMILIES"]

_IDEFICS3_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in (1, 2) for col in (1, 2)),
)
# SmolVLM's template: "User:<image> describe<end_of_utterance>\nAssistant:".
_IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% if message['content'] is string %} {{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' or 'image_url' in item %}<image>"
    "{% elif item['type'] == 'text' %} {{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def _idefics3_config(model_type: str) -> Callable[[dict[str, int], int], dict[str, Any]]:
    """Idefics3 / SmolVLM: 64 px tiles of 16 px patches, pixel-shuffled 2 x 2: 4 tokens a tile."""

    def config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
        text = {
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "vocab_size": vocab,
        }
        vision = {
            "model_type": "idefics3_vision",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "num_hidden_layers": 2,
            "patch_size": 16,
            "image_size": 64,
        }
        return {
            "model_type": model_type,
            "text_config": text,
            "vision_config": vision,
            "vocab_size": vocab,
            "scale_factor": 2,
            "image_token_id": ids["<image>"],
            "pad_token_id": ids["<|endoftext|>"],
        }

    return config


def _idefics3_files(processor_class: str, image_processor: str) -> dict[str, dict[str, Any]]:
    return {
        "preprocessor_config.json": {
            "image_processor_type": image_processor,
            "processor_class": processor_class,
            "do_image_splitting": True,
            "max_image_size": {"longest_edge": 64},  # one tile
            "size": {"longest_edge": 128},  # so up to 2 x 2 tiles and the global view
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
        "processor_config.json": {"processor_class": processor_class, "image_seq_len": 4},
    }


IDEFICS3_FAMILIES: dict[str, TinyFamily] = {
    model_type: TinyFamily(
        model_type=model_type,
        special_tokens=_IDEFICS3_TOKENS,
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
        chat_template=_IDEFICS3_TEMPLATE,
        config=_idefics3_config(model_type),
        files=_idefics3_files(processor, image_processor),
        media_tokens=_IDEFICS3_TOKENS[3:],
    )
    for model_type, processor, image_processor in (
        ("idefics3", "Idefics3Processor", "Idefics3ImageProcessor"),
        ("smolvlm", "SmolVLMProcessor", "SmolVLMImageProcessor"),
    )
}
