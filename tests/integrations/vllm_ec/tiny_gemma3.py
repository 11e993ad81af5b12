"""A tiny random-weight Gemma 3 checkpoint: SigLIP vision tower, average-pooled to 16 embeddings
per image, which sit between ``<start_of_image>`` and ``<end_of_image>`` (an 18-token placeholder:
vLLM's item covers the markers, its encoder output only the 16). Word-level tokenizer built in
code with Gemma's special tokens; head_dim 32 (vLLM's CPU attention needs 32-512)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessor,
    Gemma3Processor,
    PreTrainedTokenizerFast,
)

from tests.integrations.vllm_ec.tiny_model import FILLER, WORDS, rename_weights, save_checkpoint

__all__ = ["save_tiny_gemma3"]

SPECIAL = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn> "
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }} "
    "{% if message['content'] is string %}{{ message['content'] }} {% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }} "
    "{% elif part['type'] in ('image', 'image_url') %}<start_of_image> "
    "{% endif %}{% endfor %}{% endif %}<end_of_turn> {% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn> model {% endif %}"
)
IMAGE_SIZE, PATCH, TOKENS_PER_IMAGE = 64, 8, 16


def build_tokenizer() -> PreTrainedTokenizerFast:
    # vLLM's Gemma 3 processing looks up the newline runs in the vocabulary (this tokenizer splits
    # on whitespace, so it never produces them).
    newlines = ["\n" * count for count in range(1, 5)]
    vocab = {token: index for index, token in enumerate([*SPECIAL, *WORDS, "model", *newlines, *FILLER])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    wrapped.add_special_tokens({"additional_special_tokens": SPECIAL[4:]})
    return wrapped


def save_tiny_gemma3(directory: Path, *, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL}
    config = Gemma3Config(
        text_config={
            "hidden_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "intermediate_size": 256,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 4096,
            "sliding_window": 512,
            "bos_token_id": ids["<bos>"],
            "eos_token_id": ids["<eos>"],
            "pad_token_id": ids["<pad>"],
        },
        vision_config={
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH,
            "vision_use_head": False,  # as Gemma 3's own checkpoints
        },
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
        torch_dtype="bfloat16",
    )
    image_processor = Gemma3ImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_pan_and_scan=False
    )
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=TOKENS_PER_IMAGE,
    )
    save_checkpoint(directory, Gemma3ForConditionalGeneration(config), processor, torch.bfloat16)
    rename_weights(directory, {"vision_tower.": "vision_tower.vision_model."})  # the hub's layout
    return directory
