"""Validation of cached embeddings on a hit: a wrong value is treated as a miss and replaced.

A defence in depth against serving an entry into the wrong slot (SGLang once served a 275-token
embedding into a 256-token slot after a key collision): the caller states what it expects, by a
callable or by the number of tokens per image. A malformed ``expect`` is the caller's mistake and
raises before anything is looked up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from visioncache.errors import InvalidArgumentError, UnsupportedInputTypeError, describe_input
from visioncache.level import Validator
from visioncache.trees import token_count

__all__ = ["Expectation", "batch_validator"]

# A check of a cached embedding on a hit: a callable(value) -> bool, or per image the expected
# number of tokens (the first dimension of the value's first array).
Expectation = Callable[[Any], bool] | Sequence[int] | None
_Check = Callable[[Any], bool] | int | None


def _is_sequence(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray)


def _per_image(request_expect: Expectation, length: int) -> list[_Check]:
    if request_expect is None or callable(request_expect):
        return [request_expect] * length
    if not _is_sequence(request_expect) or not all(
        isinstance(count, int) and not isinstance(count, bool) for count in request_expect
    ):
        raise UnsupportedInputTypeError(
            "expect must be a callable or a list of token counts (ints), "
            f"got {describe_input(request_expect)}"
        )
    if len(request_expect) != length:
        raise InvalidArgumentError(f"expect lists {len(request_expect)} token counts for {length} images")
    return list(request_expect)


def batch_validator(
    expect: Sequence[Expectation] | Callable[[Any], bool] | None, lengths: list[int]
) -> Validator | None:
    """Turn per-request expectations into one check by position in the flattened batch."""
    if expect is None:
        return None
    if callable(expect):
        check = expect
        return lambda _index, value: bool(check(value))
    if not _is_sequence(expect):
        raise UnsupportedInputTypeError(
            f"expect must be a callable or one expectation per request, got {describe_input(expect)}"
        )
    if len(expect) != len(lengths):
        raise InvalidArgumentError(f"expect has {len(expect)} entries for {len(lengths)} requests")
    per_image: list[_Check] = []
    for request_expect, length in zip(expect, lengths, strict=True):
        per_image.extend(_per_image(request_expect, length))

    def validate(index: int, value: Any) -> bool:
        check = per_image[index]
        if check is None:
            return True
        if callable(check):
            return bool(check(value))
        return token_count(value) == check

    return validate
