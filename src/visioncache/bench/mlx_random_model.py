"""Random-weight mlx-vlm models (Qwen2-VL, Qwen2.5-VL) with a processor built in code.

Tests, the migration example and ``visioncache bench --engine mlx`` need real mlx-vlm architectures
without downloading weights or tokenizer files: mlx layers are randomly initialised on construction,
and a word-level tokenizer over the Qwen special tokens is enough to drive the real processors and
the real ``prepare_inputs``. ``size="tiny"`` is fast on mlx-cpu; ``size="full"`` builds the
2B-class vision tower (the cost the embedding cache saves) over a one-layer text model.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

from visioncache.bench.vocabulary import SPECIAL_TOKENS, build_tokenizer
from visioncache.integrations.mlx_vlm.imports import import_mlx, import_mlx_vlm_utils

__all__ = [
    "IMAGE_MEAN",
    "IMAGE_STD",
    "Family",
    "Size",
    "build_processor",
    "build_random_model",
    "checkpoint_config",
]

Family = Literal["qwen2_vl", "qwen2_5_vl"]
Size = Literal["tiny", "full"]

# Qwen2-VL's CLIP normalisation; the numpy image processor defaults to 0.5.
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]
_PROCESSOR_CLASSES = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}


def build_processor(family: Family, tokenizer: Any) -> Any:
    """The family's mlx-vlm processor over ``tokenizer``, with mlx-vlm's torch-free numpy image
    processor (the Qwen2 and Qwen2.5 processors share it)."""
    image_processing: Any = importlib.import_module("mlx_vlm.models.qwen3_vl.processing_qwen3_vl")
    image_processor = image_processing.Qwen3VLImageProcessor(
        patch_size=14, merge_size=2, image_mean=IMAGE_MEAN, image_std=IMAGE_STD
    )
    processing: Any = importlib.import_module(f"mlx_vlm.models.{family}.processing_{family}")
    processor_class = getattr(processing, _PROCESSOR_CLASSES[family])
    return processor_class(image_processor=image_processor, tokenizer=tokenizer, video_processor=None)


def checkpoint_config(family: Family, size: Size, tokenizer: Any) -> dict[str, Any]:
    """The model's config.json contents (text settings repeated at the top level, as mlx-vlm's
    Qwen2.5-VL loader reads them there)."""
    tiny = size == "tiny"
    text: dict[str, Any] = {
        "hidden_size": 64 if tiny else 1536,
        "num_hidden_layers": 2 if tiny else 1,
        "num_attention_heads": 4 if tiny else 12,
        "num_key_value_heads": 2,
        "intermediate_size": 128 if tiny else 1024,
        "rms_norm_eps": 1e-6,
        "vocab_size": len(tokenizer),
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4] if tiny else [16, 24, 24]},
    }
    if family == "qwen2_vl":
        vision: dict[str, Any] = (
            {"depth": 2, "embed_dim": 64, "num_heads": 4, "hidden_size": 64}
            if tiny
            else {"depth": 32, "embed_dim": 1280, "num_heads": 16, "hidden_size": 1536}
        )
    elif tiny:
        vision = {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "out_hidden_size": 64,
            "num_heads": 4,
            "fullatt_block_indexes": [1],
        }
    else:
        vision = {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "out_hidden_size": 1536,
            "num_heads": 16,
        }
    token_ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIAL_TOKENS}
    return {
        "model_type": family,
        "image_token_id": token_ids["<|image_pad|>"],
        "video_token_id": token_ids["<|video_pad|>"],
        "vision_start_token_id": token_ids["<|vision_start|>"],
        "vision_end_token_id": token_ids["<|vision_end|>"],
        "vocab_size": len(tokenizer),
        "vision_config": {"model_type": family, **vision},
        "text_config": {"model_type": family, **text},
        **text,  # Qwen2.5-VL's ModelConfig.from_dict reads text settings from the top level
    }


def build_random_model(
    family: Family = "qwen2_vl", size: Size = "tiny", *, dtype: str = "float32", seed: int = 0
) -> tuple[Any, Any]:
    """A ``(model, processor)`` pair: an mlx-vlm model with random weights in ``dtype``, evaluated.

    ``dtype`` is an ``mlx.core`` dtype name (``float32``, ``bfloat16``, ``float16``). The same
    ``seed`` gives the same weights, so two builds are interchangeable in tests.
    """
    mx = import_mlx()
    utils: Any = import_mlx_vlm_utils()
    tokenizer = build_tokenizer()
    config = checkpoint_config(family, size, tokenizer)
    family_module = importlib.import_module(f"mlx_vlm.models.{family}")
    model_config = family_module.ModelConfig.from_dict(dict(config))
    model_config = utils.update_module_configs(model_config, family_module, config, ["text", "vision"])
    mx.random.seed(seed)
    model = family_module.Model(model_config)
    if dtype != "float32":
        from mlx.utils import tree_map

        model.update(tree_map(lambda parameter: parameter.astype(getattr(mx, dtype)), model.parameters()))
    mx.eval(model.parameters())
    model.eval()
    return model, build_processor(family, tokenizer)
