"""Tiny random LoRA adapters for the tiny Qwen2-VL's vision tower and connector (PEFT's file layout).

vLLM applies them to the encoder with ``--enable-tower-connector-lora``: one adapter on a tower
block's attention output projection and on the connector's (merger's) last layer, rank 4, in the
checkpoint's own names (vLLM maps them as it maps the weights).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

RANK = 4
# (checkpoint module name, input features, output features) in the tiny model of `tiny_model`.
MODULES = (
    ("model.visual.blocks.0.attn.proj", 128, 128),
    ("model.visual.merger.mlp.2", 512, 128),
)
ENCODER_OUTPUT_WIDTH = 128  # the tiny model's text hidden size: one encoder row per image token
ENGINE_ARGUMENTS = {
    "enable_lora": True,
    "enable_tower_connector_lora": True,
    "max_lora_rank": 8,
    "max_loras": 2,
    "max_cpu_loras": 4,
}


def save_adapter(directory: Path, seed: int) -> Path:
    """An adapter whose weights are drawn from ``seed`` (large enough to change the outputs)."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, features_in, features_out in MODULES:
        tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(
            RANK, features_in, generator=generator
        )
        tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(
            features_out, RANK, generator=generator
        )
    save_file(
        {name: tensor * 0.5 for name, tensor in tensors.items()}, directory / "adapter_model.safetensors"
    )
    config = {
        "peft_type": "LORA",
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "task_type": "CAUSAL_LM",
        "target_modules": [name for name, _, _ in MODULES],
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def copy_adapter(source: Path, target: Path) -> Path:
    """The same adapter's files at another path (the same weights under another name)."""
    shutil.copytree(source, target)
    return target
