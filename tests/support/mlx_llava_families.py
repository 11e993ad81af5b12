"""The LLaVA and Mistral 3 tiny checkpoints (`tests.support.mlx_families` builds them), with their
real checkpoints' processing settings; only widths and depths are shrunk.

- **LLaVA**, as llava-hf/llava-1.5-7b-hf: a CLIP tower at 336 px in 14 px patches (576 image
  tokens; the class token dropped, the second-to-last layer's features), CLIPImageProcessor
  (shortest edge 336, centre crop 336, CLIP's mean and std), LLaVA 1.5's ``USER: ... ASSISTANT:``
  template, a llama language model.
- **Mistral 3**, as Mistral-Small-3.1-24B-Instruct-2503: a Pixtral tower (14 px patches, images
  up to 1540 px on their longest edge, kept at their own aspect ratio), patches merged 2 x 2,
  ``[IMG]`` tokens per merged patch with ``[IMG_BREAK]`` between rows and ``[IMG_END]`` last;
  a mistral language model.
"""

from __future__ import annotations

from typing import Any

from tests.support.mlx_tiny_family import TINY_TEXT, TinyFamily

__all__ = ["LLAVA_FAMILIES"]

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

_LLAVA_TOKENS = ("<unk>", "<s>", "</s>", "<image>", "<pad>")
# LLaVA 1.5's template (llava-hf): images first in a message, then its text; no system role name.
_LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' or 'image_url' in item %}"
    "{{ '<image>\n' }}{% endif %}{% endfor %}"
    "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] + ' ' }}"
    "{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def _llava_config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
    text = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "vocab_size": vocab,
    }
    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "image_size": 336,
        "patch_size": 14,
        "projection_dim": 32,
        "layer_norm_eps": 1e-5,
    }
    return {
        "model_type": "llava",
        "text_config": text,
        "vision_config": vision,
        "vocab_size": vocab,
        "image_token_index": ids["<image>"],
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "projector_hidden_act": "gelu",
        "pad_token_id": ids["<pad>"],
    }


_LLAVA_FILES: dict[str, dict[str, Any]] = {
    "preprocessor_config.json": {
        "image_processor_type": "CLIPImageProcessor",
        "processor_class": "LlavaProcessor",
        "crop_size": {"height": 336, "width": 336},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 336},
    },
    "processor_config.json": {
        "processor_class": "LlavaProcessor",
        "patch_size": 14,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
        "image_token": "<image>",
    },
}

_MISTRAL3_TOKENS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "<pad>",
)
# Mistral Small 3.1's layout: <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]answer</s>
_MISTRAL3_TEMPLATE = (
    "{{ '<s>' }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST]' }}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image_url' in item %}{{ '[IMG]' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}{{ '[/INST]' }}"
    "{% else %}{{ message['content'] + '</s>' }}{% endif %}{% endfor %}"
)


def _mistral3_config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
    text = {
        "model_type": "mistral",
        **TINY_TEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e9,
        "max_position_embeddings": 131072,
        "vocab_size": vocab,
    }
    vision = {
        "model_type": "pixtral",
        "hidden_size": 32,
        "head_dim": 16,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "image_size": 1540,
        "patch_size": 14,
        "rope_theta": 10000.0,
    }
    return {
        "model_type": "mistral3",
        "text_config": text,
        "vision_config": vision,
        "vocab_size": vocab,
        "image_token_index": ids["[IMG]"],
        "spatial_merge_size": 2,
        "vision_feature_layer": -1,
        "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu",
        "pad_token_id": ids["<pad>"],
    }


_MISTRAL3_FILES: dict[str, dict[str, Any]] = {
    "preprocessor_config.json": {
        "image_processor_type": "PixtralImageProcessor",
        "processor_class": "PixtralProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "patch_size": {"height": 14, "width": 14},
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 1540},
    },
    "processor_config.json": {
        "processor_class": "PixtralProcessor",
        "image_token": "[IMG]",
        "image_break_token": "[IMG_BREAK]",
        "image_end_token": "[IMG_END]",
        "patch_size": 14,
        "spatial_merge_size": 2,
    },
}

LLAVA_FAMILIES: dict[str, TinyFamily] = {
    "llava": TinyFamily(
        model_type="llava",
        special_tokens=_LLAVA_TOKENS,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        chat_template=_LLAVA_TEMPLATE,
        config=_llava_config,
        files=_LLAVA_FILES,
        media_tokens=("<image>",),
        tokenizer_attributes={"image_token": "<image>"},
    ),
    "mistral3": TinyFamily(
        model_type="mistral3",
        special_tokens=_MISTRAL3_TOKENS,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        chat_template=_MISTRAL3_TEMPLATE,
        config=_mistral3_config,
        files=_MISTRAL3_FILES,
        media_tokens=("[IMG]", "[IMG_BREAK]", "[IMG_END]"),
    ),
}
