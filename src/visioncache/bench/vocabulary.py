"""The special tokens of the Qwen VL chat templates that the bench's and tests' tiny tokenizers
build (one list for the transformers, mlx and vLLM models; no heavy imports here)."""

from __future__ import annotations

__all__ = ["SPECIAL_TOKENS"]

# <|endoftext|> first (it pads and ends), then the six the chat templates mark as special, then <unk>.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<unk>",
)
