"""Tiny random-weight LLaVA-OneVision, Idefics3 (SmolVLM) and InternVL checkpoints on their real checkpoints'
processing settings: the tiled families, whose one image is several tower inputs.

Only widths and depths shrink (every tower 2 blocks of 128, head_dim 32: vLLM's CPU attention
needs 32-512). What decides how an image becomes tokens is a released checkpoint's own:

- LLaVA-OneVision (llava-onevision-qwen2-0.5b-ov-hf): SigLIP at 384 px, 14-px patches, 729
  tokens a tile, the 36 anyres grid pinpoints up to 2304 x 2304, ``anyres_max_9``, features of
  the last layer in full.
- Idefics3 (SmolVLM-256M-Instruct, an Idefics3 checkpoint): 512-px tiles of 16-px patches, pixel shuffle 4 (64
  tokens a tile), images split into tiles after resizing the longest edge to 2048, plus a global
  image.
- InternVL (InternVL3-1B-hf): 448-px tiles of 14-px patches, pixel shuffle 0.5 (256 tokens a
  tile), dynamic tiling over 1-12 tiles plus a thumbnail (the processor's ``crop_to_patches``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    GotOcr2ImageProcessor,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessor,
    Idefics3Processor,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    InternVLVideoProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessor,
    LlavaOnevisionProcessor,
    LlavaOnevisionVideoProcessor,
)

from tests.integrations.vllm_ec.tiny_model import rename_weights, save_checkpoint
from visioncache.bench.offline import randomize_constant_parameters, token_id
from visioncache.bench.vocabulary import WORDS, build_tokenizer

__all__ = ["save_tiny_idefics3", "save_tiny_internvl", "save_tiny_llava_onevision"]

DTYPE = torch.bfloat16
_CHATML = ("<|im_start|>", "<|im_end|>")
_ROW_COL = tuple(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7))
_HALF = [0.5, 0.5, 0.5]  # SigLIP's normalisation
_TOWER: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def chat_template(image: str) -> str:
    """ChatML with ``image`` where a message has an image part (what the family's own template writes)."""
    return (
        "{% for message in messages %}<|im_start|> {{ message['role'] }} "
        "{% if message['content'] is string %}{{ message['content'] }} {% else %}"
        "{% for part in message['content'] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }} "
        f"{{% elif part['type'] in ('image', 'image_url') %}}{image} "
        "{% endif %}{% endfor %}{% endif %}<|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )


def _tokenizer(specials: tuple[str, ...], named: dict[str, str], image: str) -> Any:
    tokenizer = build_tokenizer(WORDS, (*_CHATML, *specials), named)
    tokenizer.chat_template = chat_template(image)
    return tokenizer


def _text(tokenizer: Any, model_type: str) -> dict[str, Any]:
    end = token_id(tokenizer, "<|endoftext|>")
    return {
        "model_type": model_type,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 256,
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 32768,
        "bos_token_id": None,
        "eos_token_id": end,
        "pad_token_id": end,
        "torch_dtype": "bfloat16",
    }


def _save(
    directory: Path,
    model_class: Any,
    config: Any,
    processor: Any,
    seed: int,
    renames: dict[str, str] | None = None,
) -> Path:
    torch.manual_seed(seed)
    model = randomize_constant_parameters(model_class(config), seed)
    save_checkpoint(directory, model, processor, DTYPE)
    if renames:
        rename_weights(directory, renames)  # the hub's layout, which vLLM's loader maps
    return directory


def save_tiny_llava_onevision(directory: Path, *, seed: int = 0) -> Path:
    named = {"image_token": "<image>", "video_token": "<video>"}
    tokenizer = _tokenizer((), named, "<image>")
    side, patch = 384, 14
    image_processor = LlavaOnevisionImageProcessor(  # the class's defaults: 36 pinpoints, 384 px
        image_mean=_HALF, image_std=_HALF
    )
    config = LlavaOnevisionConfig(
        text_config=_text(tokenizer, "qwen2"),
        vision_config={
            **_TOWER,
            "model_type": "siglip_vision_model",
            "image_size": side,
            "patch_size": patch,
            "vision_use_head": False,  # as the released checkpoint: features come before the head
        },
        image_token_index=token_id(tokenizer, "<image>"),
        video_token_index=token_id(tokenizer, "<video>"),
        image_grid_pinpoints=image_processor.image_grid_pinpoints,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(),
        num_image_tokens=(side // patch) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        chat_template=tokenizer.chat_template,
    )
    renames = {"vision_tower.": "vision_tower.vision_model."}
    return _save(directory, LlavaOnevisionForConditionalGeneration, config, processor, seed, renames)


def save_tiny_idefics3(directory: Path, *, seed: int = 0) -> Path:
    named = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>"}
    tokenizer = _tokenizer(("<end_of_utterance>", "<global-img>", *_ROW_COL), named, "<image>")
    side, patch, shuffle = 512, 16, 4
    config = Idefics3Config(
        text_config=_text(tokenizer, "llama"),
        vision_config={**_TOWER, "image_size": side, "patch_size": patch},
        image_token_id=token_id(tokenizer, "<image>"),
        scale_factor=shuffle,
        torch_dtype="bfloat16",
    )
    image_processor = Idefics3ImageProcessor(
        do_image_splitting=True,
        size={"longest_edge": 4 * side},
        max_image_size={"longest_edge": side},
        image_mean=_HALF,
        image_std=_HALF,
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=(side // patch // shuffle) ** 2,
        chat_template=tokenizer.chat_template,
    )
    return _save(directory, Idefics3ForConditionalGeneration, config, processor, seed)


def save_tiny_internvl(directory: Path, *, seed: int = 0) -> Path:
    named = {
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    }
    tokenizer = _tokenizer((), named, "<IMG_CONTEXT>")
    side, patch = 448, 14
    tokens = (side // patch // 2) ** 2
    config = InternVLConfig(
        text_config=_text(tokenizer, "qwen2"),
        vision_config={**_TOWER, "image_size": [side, side], "patch_size": [patch, patch]},
        image_token_id=token_id(tokenizer, "<IMG_CONTEXT>"),
        image_seq_length=tokens,
        downsample_ratio=0.5,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        torch_dtype="bfloat16",
    )
    # The published preprocessor config keeps crop_to_patches off; InternVLProcessor turns it on
    # for every call (its default images kwargs): 1-12 tiles and a thumbnail.
    image_processor = GotOcr2ImageProcessor(
        size={"height": side, "width": side},
        crop_to_patches=False,
        min_patches=1,
        max_patches=12,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    processor = InternVLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(),
        image_seq_length=tokens,
        chat_template=tokenizer.chat_template,
    )
    return _save(directory, InternVLForConditionalGeneration, config, processor, seed)
