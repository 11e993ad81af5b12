"""One family's tiny checkpoint, as `tests.support.mlx_families` builds it (see there)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TINY_TEXT", "TinyFamily"]

# The tiny language models' common sizes (each family's config adds its own fields).
TINY_TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


@dataclass(frozen=True)
class TinyFamily:
    """One family's tiny checkpoint: its tokens, template, configuration and processor files."""

    model_type: str
    special_tokens: tuple[str, ...]  # added as special tokens, in this order (ids from 0)
    eos_token: str
    pad_token: str
    chat_template: str
    config: Callable[[dict[str, int], int], dict[str, Any]]  # (token ids, vocab size) -> config.json
    files: dict[str, dict[str, Any]]  # other JSON files (preprocessor_config.json, ...)
    bos_token: str | None = None
    stop_tokens: tuple[str, ...] = ()  # generation stops on these (and eos)
    tokenizer_attributes: dict[str, str] = field(default_factory=dict)  # extra_special_tokens
    # Tokens that mark images in a prompt: a random model that writes one into its answer makes
    # the next turn's history hold one placeholder too many (stock vllm-mlx then fails it too).
    media_tokens: tuple[str, ...] = ()
