"""A tiny random-weight checkpoint of any family visioncache serves on mlx, saved as a model
directory that mlx-vlm (and so vllm-mlx's server) loads like a downloaded one.

Why: engine tests and benchmarks must start the real server from a path, with no downloads. The
directory holds ``config.json``, ``model.safetensors`` (mlx layout), the word-level tokenizer with
the family's chat template, and the processor files. For Qwen2-VL and Qwen2.5-VL, loading it gives
the same weights as ``build_random_model(family, "tiny", seed=seed)``; the other families come from
`tests.support.mlx_families`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.mlx_families import TINY_FAMILIES, save_family_dir
from visioncache.bench.mlx_random_model import (
    IMAGE_MEAN,
    IMAGE_STD,
    Family,
    build_processor,
    build_random_model,
    checkpoint_config,
)
from visioncache.bench.vocabulary import build_tokenizer
from visioncache.integrations.mlx_vlm.imports import import_mlx

__all__ = [
    "FAMILIES",
    "QWEN2_VL_CHAT_TEMPLATE",
    "build_random_processor",
    "cache_as_repository",
    "save_model_dir",
]

# Every family a tiny checkpoint can be built for.
FAMILIES = ("qwen2_vl", "qwen2_5_vl", *TINY_FAMILIES)


def build_random_processor(family: Family = "qwen2_vl") -> Any:
    """The family's mlx-vlm processor over the bench's word-level tokenizer (no model, no files)."""
    return build_processor(family, build_tokenizer())


# Qwen2-VL-Instruct's chat template, as shipped with the checkpoint.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_model_dir(directory: str | Path, family: str = "qwen2_vl", *, seed: int = 0) -> Path:
    """Write a tiny random-weight ``family`` checkpoint (float32) into ``directory``; return it."""
    if family in TINY_FAMILIES:
        return save_family_dir(directory, family, seed=seed)
    return _save_qwen2_dir(directory, family, seed=seed)  # type: ignore[arg-type]


def _save_qwen2_dir(directory: str | Path, family: Family, *, seed: int) -> Path:
    from mlx.utils import tree_flatten

    mx = import_mlx()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model, processor = build_random_model(family, "tiny", seed=seed)
    tokenizer = processor.tokenizer
    tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    config = checkpoint_config(family, "tiny", tokenizer)
    special_ids = {
        "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
    }
    config.update(special_ids)
    config["text_config"].update(special_ids)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    image_processor = processor.image_processor
    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": type(processor).__name__,
        "patch_size": image_processor.patch_size,
        "temporal_patch_size": image_processor.temporal_patch_size,
        "merge_size": image_processor.merge_size,
        "min_pixels": image_processor.min_pixels,
        "max_pixels": image_processor.max_pixels,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
    }
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path


def cache_as_repository(model_dir: str | Path, home: str | Path, repo_id: str) -> str:
    """Put ``model_dir``'s files into the Hugging Face cache under ``home`` (``~/.cache/huggingface``)
    as repository ``repo_id``, so a server started with that HOME and ``--offline`` resolves the
    id as it would a downloaded model; returns ``repo_id``."""
    import shutil

    repository = Path(home) / ".cache" / "huggingface" / "hub" / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    snapshot = repository / "snapshots" / revision
    shutil.copytree(model_dir, snapshot, dirs_exist_ok=True)
    (repository / "refs").mkdir(parents=True, exist_ok=True)
    (repository / "refs" / "main").write_text(revision)
    return repo_id
