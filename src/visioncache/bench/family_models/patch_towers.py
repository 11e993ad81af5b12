"""Offline models of Mistral 3 (Pixtral tower) and GLM-4V."""

from __future__ import annotations

import torch
from transformers import (
    Glm4vConfig,
    Glm4vForConditionalGeneration,
    Glm4vProcessor,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
)
from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil
from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

from visioncache.bench.family_models.checkpoints import CHECKPOINTS
from visioncache.bench.family_models.spec import TINY_TEXT, FamilyModel
from visioncache.bench.offline import (
    image_only_processor,
    import_without_torchvision,
    random_model,
    token_id,
    tower,
)
from visioncache.bench.vocabulary import WORDS, build_tokenizer

__all__ = ["glm4v", "mistral3"]


def mistral3(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    """Mistral 3: images up to 1540 pixels (never enlarged) in 14-pixel patches merged 2x2, the
    stock ``PixtralProcessor`` (imported without its torchvision helper)."""
    vision_config = tower("mistral3", vision)
    checkpoint = CHECKPOINTS["mistral3"]
    tokenizer = build_tokenizer(
        WORDS, ("<s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"), eos="</s>", pad="<pad>"
    )
    config = Mistral3Config(
        text_config={
            **TINY_TEXT,
            "model_type": "mistral",
            "head_dim": 16,
            "vocab_size": len(tokenizer),
            "pad_token_id": token_id(tokenizer, "<pad>"),
            "eos_token_id": token_id(tokenizer, "</s>"),
        },
        vision_config={**vision_config, "model_type": "pixtral"},
        image_token_index=token_id(tokenizer, "[IMG]"),
        **checkpoint.config,
    )
    model = random_model(Mistral3ForConditionalGeneration, config, dtype, seed)
    image_processor = PixtralImageProcessorPil(**checkpoint.image_processor)
    processor_class = import_without_torchvision(
        "transformers.models.pixtral.processing_pixtral"
    ).PixtralProcessor
    processor = processor_class(image_processor=image_processor, tokenizer=tokenizer, **checkpoint.processor)
    return FamilyModel("mistral3", model, processor, "[IMG]")


def glm4v(vision: str, dtype: torch.dtype, seed: int) -> FamilyModel:
    """GLM-4V: Qwen2-VL's 14-pixel patches merged 2x2 (112x112 to 9,633,792 pixels), between
    begin/end of image markers."""
    marks = (
        "<|user|>",
        "<|assistant|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
    )
    named = {"image_token": "<|image|>", "video_token": "<|video|>"}
    tokenizer = build_tokenizer(WORDS, marks, named, eos="<|endoftext|>", pad="<|endoftext|>")
    end = token_id(tokenizer, "<|endoftext|>")
    vision_config = tower("glm4v", vision)
    # The tower's MLP width is its output width, the language model's: a one-layer text model of
    # that width for the full tower (GLM-4.1V-9B's 4096).
    width = int(vision_config["out_hidden_size"])
    heads = 4 if vision == "tiny" else 32
    rotary_half = width // heads // 4  # half of the rotary dimensions (partial_rotary_factor 0.5)
    sections = [rotary_half // 4, rotary_half - rotary_half // 4 - rotary_half // 2, rotary_half // 2]
    rope = {
        "rope_type": "default",
        "rope_theta": 10000,
        "mrope_section": sections,
        "partial_rotary_factor": 0.5,
    }
    text = {**TINY_TEXT, "hidden_size": width, "num_attention_heads": heads}
    if vision != "tiny":
        text.update(num_hidden_layers=1, intermediate_size=1024)
    config = Glm4vConfig(
        text_config={
            **text,
            "vocab_size": len(tokenizer),
            "pad_token_id": end,
            "eos_token_id": end,
            "rope_parameters": rope,
        },
        vision_config=vision_config,
        image_token_id=token_id(tokenizer, "<|image|>"),
        video_token_id=token_id(tokenizer, "<|video|>"),
        image_start_token_id=token_id(tokenizer, "<|begin_of_image|>"),
        image_end_token_id=token_id(tokenizer, "<|end_of_image|>"),
        video_start_token_id=token_id(tokenizer, "<|begin_of_video|>"),
        video_end_token_id=token_id(tokenizer, "<|end_of_video|>"),
    )
    model = random_model(Glm4vForConditionalGeneration, config, dtype, seed)
    image_processor = Glm4vImageProcessorPil(**CHECKPOINTS["glm4v"].image_processor)
    processor = image_only_processor(Glm4vProcessor, image_processor=image_processor, tokenizer=tokenizer)
    return FamilyModel("glm4v", model, processor, "<|begin_of_image|><|image|><|end_of_image|>")
