"""Framing and domain keys: the two primitives that keep different inputs from sharing hash input."""

from __future__ import annotations

import struct

from blake3 import blake3

__all__ = ["DIGEST_SIZE", "domain_key", "frame"]

DIGEST_SIZE = 32  # bytes: 256-bit blake3, never truncated


def frame(data: bytes) -> bytes:
    """Length-prefix a field so that concatenated fields can be split in only one way."""
    return struct.pack("<Q", len(data)) + data


def domain_key(domain: str) -> bytes:
    """The 32-byte blake3 key of one input domain: inputs hashed under different keys never collide."""
    return bytes(blake3(domain.encode()).digest())
