"""The words and special tokens of the tiny tokenizers the bench and the tests build (one
vocabulary for the transformers, mlx and vLLM models), the Qwen VL placeholders, and the builder.

No heavy imports at module level: the mlx and vLLM environments import this too.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

__all__ = ["IMAGE_PLACEHOLDER", "SPECIAL_TOKENS", "VIDEO_PLACEHOLDER", "WORDS", "build_tokenizer"]

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
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"  # one image in a Qwen VL prompt
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"
# Words of the chat prompts the bench and the tests send (and of the random models' answers);
# any other word tokenises to <unk>.
WORDS = (
    *("user", "assistant", "system", "describe", "the", "image", "images", "what", "is", "in", "this"),
    *("that", "these", "picture", "photo", "a", "an", "of", "and", "or", "on", "with", "who", "where"),
    *("which", "colour", "color", "cat", "dog", "person", "cup", "coffee", "woman", "man", "how"),
    *("many", "are", "there", "compare", "first", "second", "third", "last", "one", "two", "it"),
    *("now", "again", "please", "more", "detail", "details", "about", "tell", "me", "show", "see"),
    *("look", "here", "background", "foreground", "left", "right", "you", "helpful", "at", "red"),
    *("green", "blue", "big", "small", "top", "bottom", "three", "has", "shape", "tree", "house"),
    *("car", "sky", "sea", "animal", "light", "dark", "near", "far", "yes", "no"),
)


def build_tokenizer(words: Iterable[str] = WORDS) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over ``SPECIAL_TOKENS`` and ``words`` (no files),
    whose special tokens are atomic, as in Qwen's real tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    # Imported as Any: transformers' tokenizer classes are untyped for mypy --strict.
    transformers: Any = importlib.import_module("transformers")
    vocabulary = {token: index for index, token in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *words]))}
    word_level = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, unk_token="<unk>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    # Special tokens are matched before whitespace splitting, so "<|vision_start|><|image_pad|>"
    # tokenises as two tokens, as with the real Qwen tokenizer.
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:7])})
    return tokenizer
