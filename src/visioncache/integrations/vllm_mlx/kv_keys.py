"""Image-aware keys for vllm-mlx's token-keyed KV prefix cache.

vllm-mlx keys cached KV by the prompt's token ids. In an image prompt every placeholder token has
the same id whatever the image, so two prompts with different images would share a key: the
engine therefore never caches image prompts. Here each placeholder id is replaced by an id
derived from (namespace, salt, image digest, position of the image's first token, index in the
run). Those ids are negative, so they never equal a real token id, and 31 bits each: a key of an
image of n tokens matches another image's only if n independent 31-bit values agree. The same
image at another position, or another model or processor configuration (namespace), gives
different ids, so their KV is never shared. With a tenant salt, the first id of EVERY key (text-only
prompts included) is replaced by one derived from the salt, so tenants share no KV at all (not
even a common system prompt's, whose reuse would show in their time to first token). The ids
survive vllm-mlx's prefix-cache persistence, which stores keys as 32-bit signed integers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from blake3 import blake3

from visioncache import PlaceholderMismatchError
from visioncache.integrations.fingerprint import fingerprint

__all__ = ["PrefixKey", "image_run_ids", "prefix_key", "tenant_key"]

_DOMAIN = "visioncache vllm-mlx image KV ids v1"
_TENANT_DOMAIN = "visioncache vllm-mlx tenant KV id v1"


@dataclass(frozen=True)
class PrefixKey:
    """A prompt's real token ids and its image-aware key (the same length, position for position),
    and whether a hit reusing n of its tokens from a stored entry of m tokens (None: not known)
    may be used (`Family.reusable_prefix`; None: any hit)."""

    token_ids: tuple[int, ...]
    key: tuple[int, ...]
    reusable: Callable[[int, int | None], bool] | None = None


def _negative_ids(seed_hex: str, count: int) -> list[int]:
    """``count`` ids in ``[-2**31, -1]`` drawn from blake3's output stream for ``seed_hex``."""
    stream = blake3(bytes.fromhex(seed_hex)).digest(length=4 * count)
    values = np.frombuffer(stream, dtype="<u4") & np.uint32(0x7FFFFFFF)
    ids: list[int] = (-1 - values.astype(np.int64)).tolist()
    return ids


def image_run_ids(
    namespace: str, salt: str | bytes | None, digest: bytes, start: int, count: int
) -> list[int]:
    """The ``count`` ids of an image whose first placeholder token sits at ``start``."""
    return _negative_ids(fingerprint([_DOMAIN, namespace, salt or b"", digest, str(start)]), count)


def tenant_key(key: Sequence[int], salt: str | bytes | None) -> tuple[int, ...]:
    """``key`` with its first id replaced by one derived from ``salt`` (unchanged without a salt)."""
    if not salt or not key:
        return tuple(key)
    return (_negative_ids(fingerprint([_TENANT_DOMAIN, salt, str(key[0])]), 1)[0], *key[1:])


def prefix_key(
    token_ids: Sequence[int],
    image_token_id: int,
    images: Sequence[tuple[bytes, int]],
    *,
    namespace: str,
    salt: str | bytes | None,
    reusable: Callable[[int, int | None], bool] | None = None,
) -> PrefixKey:
    """The key of a prompt whose placeholders hold ``images``: (digest, token count) in order.

    Placeholders are consumed in order, as the model consumes image features; ``reusable`` says
    which hits may be used (`PrefixKey.reusable`). Raises
    PlaceholderMismatchError when their number is not the images' total token count.
    """
    real = tuple(int(token) for token in token_ids)
    positions = [index for index, token in enumerate(real) if token == image_token_id]
    expected = sum(count for _, count in images)
    if len(positions) != expected:
        raise PlaceholderMismatchError(
            f"the prompt holds {len(positions)} image placeholder tokens but its images need {expected}"
        )
    key = list(real)
    offset = 0
    for digest, count in images:
        run = positions[offset : offset + count]
        for position, value in zip(run, image_run_ids(namespace, salt, digest, run[0], count), strict=True):
            key[position] = value
        offset += count
    return PrefixKey(real, tenant_key(key, salt), reusable)
