"""The words and special tokens of the tiny tokenizers the bench and the tests build (one
vocabulary for the transformers, mlx and vLLM models), the Qwen VL placeholders, and the builder.

No heavy imports at module level: the mlx and vLLM environments import this too.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
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


def build_tokenizer(
    words: Iterable[str] = WORDS,
    specials: Sequence[str] = SPECIAL_TOKENS[1:7],
    named: Mapping[str, str] | None = None,
    *,
    eos: str = "<|endoftext|>",
    pad: str = "<|endoftext|>",
) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` (no files) over ``pad``, ``eos``, ``specials`` and
    ``named``'s tokens, ``<unk>``, then ``words``; its special tokens are atomic, as in the real
    tokenizers. The defaults are Qwen VL's (``SPECIAL_TOKENS``). ``named`` tokens also become
    attributes (``tokenizer.image_token``), as a checkpoint's tokenizer config declares them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    # Imported as Any: transformers' tokenizer classes are untyped for mypy --strict.
    transformers: Any = importlib.import_module("transformers")
    named = dict(named or {})
    special = list(dict.fromkeys([pad, eos, *specials, *named.values()]))
    vocabulary = {token: index for index, token in enumerate(dict.fromkeys([*special, "<unk>", *words]))}
    word_level = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    attributes = {"model_specific_special_tokens": named} if named else {}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, unk_token="<unk>", eos_token=eos, pad_token=pad, **attributes
    )
    # Special tokens are matched before whitespace splitting, so "<|vision_start|><|image_pad|>"
    # tokenises as two tokens, as with the real Qwen tokenizer.
    tokenizer.add_special_tokens({"additional_special_tokens": [t for t in special if t not in (eos, pad)]})
    return tokenizer
