"""A tiny random-weight Qwen2-VL checkpoint, saved to a directory vLLM can serve offline.

Real architecture and real processor (Qwen2-VL image and video processors, a word-level tokenizer
built in code, a Qwen-style chat template), random weights. The text model has hidden size 128 with
4 heads (head_dim 32: vLLM's CPU attention needs 32-512); the vision tower is 2 blocks of 128.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
)

from visioncache.bench.vocabulary import SPECIAL_TOKENS

WORDS = [
    "system",
    "user",
    "assistant",
    "you",
    "are",
    "a",
    "helpful",
    "describe",
    "the",
    "image",
    "what",
    "is",
    "in",
    "this",
    "picture",
    "cat",
    "dog",
    "and",
    "or",
    "of",
    "to",
    "on",
    "with",
    "colour",
    "shape",
    "left",
    "right",
    "top",
    "bottom",
    "compare",
    "these",
    "two",
    "images",
    "now",
    "again",
    "which",
    "one",
    "brighter",
    "darker",
    "more",
    "less",
    "same",
    "different",
    "how",
    "many",
    "objects",
    "tell",
    "me",
    "about",
    "it",
]
# Enough extra tokens that random weights produce varied text.
FILLER = [f"w{index}" for index in range(400)]

# Each message: "<|im_start|> role content <|im_end|>"; an image part is the Qwen-VL placeholder.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|> {{ message['role'] }} "
    "{% if message['content'] is string %}{{ message['content'] }} {% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }} "
    "{% elif part['type'] in ('image', 'image_url') %}<|vision_start|> <|image_pad|> <|vision_end|> "
    "{% endif %}{% endfor %}{% endif %}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *WORDS, *FILLER])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
    wrapped.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:7])})
    return wrapped


# Vision towers: "tiny" for tests; "medium" (12 blocks of 512) makes encoding cost what a real
# tower's does relative to the rest, for the benchmark.
VISION_TOWERS = {
    "tiny": {"depth": 2, "embed_dim": 128, "num_heads": 4},
    "medium": {"depth": 12, "embed_dim": 512, "num_heads": 8},
}


def save_tiny_qwen2_vl(
    directory: Path,
    *,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    vision: str = "tiny",
    max_pixels: int = 224 * 224,
) -> Path:
    """Build and save the checkpoint (config, safetensors weights, tokenizer, processors)."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config = Qwen2VLConfig(
        vision_config={
            **VISION_TOWERS[vision],
            "hidden_size": 128,
            "mlp_ratio": 2,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
        },
        text_config={
            "hidden_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 256,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
            "bos_token_id": None,
            "eos_token_id": ids["<|endoftext|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "torch_dtype": str(dtype).removeprefix("torch."),
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        torch_dtype=str(dtype).removeprefix("torch."),
    )
    # Small images keep the vision tower cheap: by default at most 64 merged tokens per image.
    image_processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=max_pixels)
    processor = Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    return save_checkpoint(directory, Qwen2VLForConditionalGeneration(config), processor, dtype)


def save_checkpoint(directory: Path, model: Any, processor: Any, dtype: torch.dtype) -> Path:
    """Save a random-weight model (in ``dtype``), its processor and a greedy generation config."""
    directory.mkdir(parents=True, exist_ok=True)
    model.to(dtype).eval().save_pretrained(directory)
    processor.save_pretrained(directory)
    generation = {"do_sample": False, "eos_token_id": processor.tokenizer.eos_token_id}
    (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def rename_weights(directory: Path, prefixes: dict[str, str]) -> None:
    """Rename weight-name prefixes in the saved safetensors files: transformers 5 saves some
    families in a layout vLLM's loader does not map (its mappers follow the hub's checkpoints)."""
    from safetensors.torch import load_file, save_file

    for path in directory.glob("*.safetensors"):
        tensors = load_file(path)
        renamed = {}
        for name, tensor in tensors.items():
            for old, new in prefixes.items():
                if name.startswith(old) and not name.startswith(new):
                    name = new + name[len(old) :]
                    break
            renamed[name] = tensor
        save_file(renamed, path, metadata={"format": "pt"})
