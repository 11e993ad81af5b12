"""Real-architecture Qwen VLMs built offline: random weights, in-code tokenizer, PIL image processor.

Why: the bench and the tests must run the real Qwen2-VL / Qwen2.5-VL / Qwen3-VL code paths (vision
tower, merger, M-RoPE, deepstack) on a machine that cannot download weights. Random weights are
enough to prove that a cached path gives the same outputs as the uncached one and to time the
vision tower, whose cost does not depend on the weights' values. ``load_model`` opens a local
checkpoint directory when the user has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    AutoTokenizer,
    PreTrainedModel,
    ProcessorMixin,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from visioncache.bench.family_models.checkpoints import CHECKPOINTS
from visioncache.bench.offline import image_only_processor, tower
from visioncache.bench.vocabulary import SPECIAL_TOKENS, build_tokenizer
from visioncache.errors import ConfigurationError

__all__ = ["FAMILIES", "VISION_SIZES", "build_offline_model", "load_model"]

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
VISION_SIZES = ("tiny", "full")


_TEXT_TINY = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128
)
# family -> (config class, model class, processor class, text extras); the vision tower is
# `offline.tower(family, vision)`, the image processor the published checkpoint's (CHECKPOINTS).
_QWEN2_ROPE = dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 2, 4]})
_FAMILY_SPECS: dict[str, tuple[Any, Any, Any, dict[str, Any]]] = {
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor, _QWEN2_ROPE),
    "qwen2_5_vl": (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        _QWEN2_ROPE,
    ),
    "qwen3_vl": (
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
        dict(
            head_dim=16,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5e6,
                "mrope_section": [2, 3, 3],
                "mrope_interleaved": True,
            },
        ),
    ),
}
# With Qwen2-VL-2B's vision tower, a one-layer text model of the 2B's width keeps the prefill cheap.
_FULL_TEXT = dict(
    hidden_size=1536,
    num_hidden_layers=1,
    num_attention_heads=12,
    num_key_value_heads=2,
    intermediate_size=1024,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
)


def build_offline_model(
    family: str = "qwen2_vl", vision: str = "tiny", dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[PreTrainedModel, ProcessorMixin]:
    """A random-weight model of ``family`` and its processor; ``vision="full"`` is Qwen2-VL-2B's tower."""
    if family not in _FAMILY_SPECS:
        raise ConfigurationError(f"unknown model family {family!r}; choose one of {FAMILIES}")
    if vision not in VISION_SIZES:
        raise ConfigurationError(f"unknown vision size {vision!r}; choose one of {VISION_SIZES}")
    if vision == "full" and family != "qwen2_vl":
        raise ConfigurationError("--vision full is defined for qwen2_vl only")
    config_class, model_class, processor_class, text_extra = _FAMILY_SPECS[family]
    tokenizer = build_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    text_config = {**_TEXT_TINY, **text_extra} if vision == "tiny" else dict(_FULL_TEXT)
    config = config_class(
        vision_config=tower(family, vision),
        text_config={
            **text_config,
            "vocab_size": len(tokenizer),
            "bos_token_id": None,
            "eos_token_id": ids["<|endoftext|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = model_class(config).to(dtype).eval()
    image_processor = Qwen2VLImageProcessorPil(**CHECKPOINTS[family].image_processor)
    return model, image_only_processor(processor_class, image_processor=image_processor, tokenizer=tokenizer)


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, ProcessorMixin]:
    """A local checkpoint directory's model and processor; a bad path is a ConfigurationError.

    The processor is assembled from the checkpoint's tokenizer and image-processor settings with
    the PIL image processor, like the offline models: the stock processors also load a video
    processor, which needs torchvision.
    """
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ConfigurationError(
            f"--model {str(path)!r} is not a checkpoint directory (no config.json in it)"
        )
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        if config.model_type not in _FAMILY_SPECS:
            raise ConfigurationError(
                f"--model {str(path)!r} is a {config.model_type!r} model; supported: {FAMILIES}"
            )
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(directory, local_files_only=True)
        model = AutoModelForImageTextToText.from_pretrained(directory, dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError, ImportError) as error:
        raise ConfigurationError(f"cannot load --model {str(path)!r}: {error}") from error
    processor = image_only_processor(
        _FAMILY_SPECS[config.model_type][2], image_processor=image_processor, tokenizer=tokenizer
    )
    return model.eval(), processor  # type: ignore[no-untyped-call]
