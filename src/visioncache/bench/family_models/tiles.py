"""Offline models of the tiled families: InternVL, Idefics3, SmolVLM, LLaVA-OneVision."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3Processor,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionProcessor,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMProcessor,
)
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
    LlavaOnevisionImageProcessorPil,
)
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

from visioncache.bench.family_models.checkpoints import CHECKPOINTS
from visioncache.bench.family_models.spec import TINY_TEXT, FamilyModel
from visioncache.bench.offline import (
    image_only_processor,
    random_model,
    token_id,
    tower,
)
from visioncache.bench.vocabulary import WORDS, build_tokenizer

__all__ = ["idefics3", "internvl", "llava_onevision", "smolvlm"]

_CHATML = ("<|im_start|>", "<|im_end|>")
_ROW_COL = tuple(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7))


def _text(tokenizer: Any, model_type: str) -> dict[str, Any]:
    end = token_id(tokenizer, "<|endoftext|>")
    return {
        **TINY_TEXT,
        "model_type": model_type,
        "vocab_size": len(tokenizer),
        "pad_token_id": end,
        "eos_token_id": end,
    }


def internvl(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    """InternVL: dynamic tiling, 1 to 12 tiles of 448 pixels plus a thumbnail, 256 tokens a tile
    (14-pixel patches pixel-shuffled 2x2)."""
    checkpoint = CHECKPOINTS["internvl"]
    named = {
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    }
    tokenizer = build_tokenizer(WORDS, _CHATML, named, eos="<|endoftext|>", pad="<|endoftext|>")
    config = InternVLConfig(
        text_config=_text(tokenizer, "qwen2"),
        vision_config=tower("internvl", vision),
        image_token_id=token_id(tokenizer, "<IMG_CONTEXT>"),
        **checkpoint.config,
    )
    model = random_model(InternVLForConditionalGeneration, config, dtype, seed)
    # crop_to_patches stays the image processor's default (False): InternVLProcessor turns it on
    # for every call (InternVLProcessorKwargs), as for the published checkpoint.
    image_processor = GotOcr2ImageProcessorPil(**checkpoint.image_processor)
    processor = image_only_processor(
        InternVLProcessor, image_processor=image_processor, tokenizer=tokenizer, **checkpoint.processor
    )
    return FamilyModel("internvl", model, processor, "<IMG_CONTEXT>")


def _idefics_tokenizer(named: dict[str, str]) -> Any:
    return build_tokenizer(
        WORDS,
        (*_CHATML, "<end_of_utterance>", "<global-img>", *_ROW_COL),
        {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>", **named},
        eos="<|endoftext|>",
        pad="<|endoftext|>",
    )


def _tiled(family: str, vision: str, dtype: torch.dtype, seed: int, named: dict[str, str]) -> FamilyModel:
    """Idefics3 or SmolVLM: images resized to the published longest edge (1456 or 2048 pixels) and
    split into tiles of the tower's size (364 or 512) plus a global image, pixel-shuffled (2x2 or
    4x4: 169 or 64 tokens a tile)."""
    classes: dict[str, tuple[Any, Any, Any, Any]] = {
        "idefics3": (
            Idefics3Config,
            Idefics3ForConditionalGeneration,
            Idefics3Processor,
            Idefics3ImageProcessorPil,
        ),
        "smolvlm": (
            SmolVLMConfig,
            SmolVLMForConditionalGeneration,
            SmolVLMProcessor,
            SmolVLMImageProcessorPil,
        ),
    }
    config_class, model_class, processor_class, image_processor_class = classes[family]
    checkpoint = CHECKPOINTS[family]
    tokenizer = _idefics_tokenizer(named)
    config = config_class(
        text_config=_text(tokenizer, "llama"),
        vision_config=tower(family, vision),
        image_token_id=token_id(tokenizer, "<image>"),
        **checkpoint.config,
    )
    model = random_model(model_class, config, dtype, seed)
    image_processor = image_processor_class(**checkpoint.image_processor)
    processor = image_only_processor(
        processor_class, image_processor=image_processor, tokenizer=tokenizer, **checkpoint.processor
    )
    return FamilyModel(family, model, processor, "<image>")


def idefics3(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    return _tiled("idefics3", vision, dtype, seed, {})


def smolvlm(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    """SmolVLM (SmolVLM2's processor)."""
    named = {
        "global_image_token": "<global-img>",
        "end_of_utterance_token": "<end_of_utterance>",
        "video_token": "<video>",
    }
    return _tiled("smolvlm", vision, dtype, seed, named)


def llava_onevision(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    """LLaVA-OneVision: 384-pixel base patches (729 features), anyres grids up to 6x6 patches
    (pooled beyond 9: ``anyres_max_9``), the whole tower output (``full``)."""
    vision_config = tower("llava_onevision", vision)
    checkpoint = CHECKPOINTS["llava_onevision"]
    tokenizer = build_tokenizer(
        WORDS,
        _CHATML,
        {"image_token": "<image>", "video_token": "<video>"},
        eos="<|endoftext|>",
        pad="<|endoftext|>",
    )
    image_processor = LlavaOnevisionImageProcessorPil(**checkpoint.image_processor)
    config = LlavaOnevisionConfig(
        text_config=_text(tokenizer, "qwen2"),
        vision_config={**vision_config, "model_type": "siglip_vision_model"},
        image_token_index=token_id(tokenizer, "<image>"),
        video_token_index=token_id(tokenizer, "<video>"),
        **checkpoint.config,
    )
    model = random_model(LlavaOnevisionForConditionalGeneration, config, dtype, seed)
    processor = image_only_processor(
        LlavaOnevisionProcessor,
        image_processor=image_processor,
        tokenizer=tokenizer,
        **checkpoint.processor,
    )
    return FamilyModel("llava_onevision", model, processor, "<image>")
