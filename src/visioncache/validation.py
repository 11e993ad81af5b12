"""Validation of cached embeddings on a hit: a wrong value is treated as a miss and replaced.

A defence in depth against serving an entry into the wrong slot (SGLang once served a 275-token
embedding into a 256-token slot after a key collision): the caller states what it expects, by a
callable or by the number of tokens per image.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from visioncache.batching import Validator
from visioncache.errors import EncoderOutputError

__all__ = ["Expectation", "batch_validator", "token_count"]

# A check of a cached embedding on a hit: a callable(value) -> bool, or per image the expected
# number of tokens (the first dimension of the value's first array).
Expectation = Callable[[Any], bool] | Sequence[int] | None


def batch_validator(
    expect: Sequence[Expectation] | Callable[[Any], bool] | None, lengths: list[int]
) -> Validator | None:
    """Turn per-request expectations into one check by position in the flattened batch."""
    if expect is None:
        return None
    if callable(expect):
        check = expect
        return lambda _index, value: bool(check(value))
    if len(expect) != len(lengths):
        raise EncoderOutputError(f"expect has {len(expect)} entries for {len(lengths)} requests")
    per_image: list[Callable[[Any], bool] | int | None] = []
    for request_expect, length in zip(expect, lengths, strict=True):
        if request_expect is None or callable(request_expect):
            per_image.extend([request_expect] * length)
        elif len(request_expect) != length:
            raise EncoderOutputError(f"expect lists {len(request_expect)} token counts for {length} images")
        else:
            per_image.extend(request_expect)

    def validate(index: int, value: Any) -> bool:
        check = per_image[index]
        if check is None:
            return True
        if callable(check):
            return bool(check(value))
        return token_count(value) == check

    return validate


def token_count(value: Any) -> int | None:
    """The first dimension of the first array in a value (depth-first, dicts in insertion order)."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    children: Sequence[Any] = ()
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, list | tuple):
        children = value
    for child in children:
        count = token_count(child)
        if count is not None:
            return count
    return None
