"""Cache keys: namespace + salt + level + ordered image digests (+ prompt digest where it matters).

A key is ``"<namespace tag>/<level>/<64 hex>"``. The tag (32 hex characters, 128 bits of a digest of
the namespace and salt) lets shared tiers list and separate namespaces. For a per-image level the
64 hex are the image's own digest, or, with a salt, that digest keyed by the salt (so a tenant's
keys, even listed from a shared tier, do not reveal which images it processed). Otherwise they are a
digest over every field, framed, so the order of images, their count and the prompt are all part
of the identity.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from blake3 import blake3

from visioncache.errors import (
    ConfigurationError,
    UnsupportedImageTypeError,
    UnsupportedInputTypeError,
    describe_input,
)
from visioncache.identity.hasher import ImageHasher, frame

__all__ = ["DEFAULT_NAMESPACE", "KEY_FORMAT_VERSION", "ImageKeys", "KeyBuilder", "is_image_sequence"]

KEY_FORMAT_VERSION = 2  # bumped whenever keys or stored values change format (tiers/serialization.py)
DEFAULT_NAMESPACE = "default"


def _encoded(name: str, value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ConfigurationError(f"{name} must be encodable as UTF-8: {error}") from None


class KeyBuilder:
    """Composes keys for one (namespace, salt); the shared prefix is hashed once."""

    def __init__(self, namespace: str = DEFAULT_NAMESPACE, salt: str | bytes | None = None):
        if not isinstance(namespace, str) or not namespace:
            raise ConfigurationError(f"namespace must be a non-empty str, got {namespace!r}")
        if salt is not None and not isinstance(salt, str | bytes):
            raise ConfigurationError(f"salt must be str, bytes or None, got {type(salt).__name__}")
        self.namespace = namespace
        self.salt = salt
        prefix = (
            b"visioncache/key\0"
            + struct.pack("<I", KEY_FORMAT_VERSION)
            + frame(_encoded("namespace", namespace))
            + struct.pack("<?", salt is not None)
            + frame(_encoded("salt", salt or b""))
        )
        self._prefix = blake3(prefix)
        self.tag = blake3(prefix).hexdigest()[:32]
        # With a salt, per-image keys hide the image digest behind a key derived from the salt.
        self._digest_key = blake3(prefix + b"\0per-image").digest() if salt is not None else None

    def image_key(self, level: str, digest: bytes) -> str:
        """The key of one image in a per-image level (no hashing unless a salt keys the digest)."""
        if self._digest_key is not None:
            return f"{self.tag}/{level}/{blake3(digest, key=self._digest_key).hexdigest()}"
        return f"{self.tag}/{level}/{digest.hex()}"

    def key(self, level: str, digests: Sequence[bytes], prompt: str | None = None) -> str:
        """The key of ``level`` for these image digests, in order, and an optional prompt."""
        if prompt is not None and not isinstance(prompt, str):
            raise UnsupportedInputTypeError(f"prompt must be a str, got {describe_input(prompt)}")
        if prompt is None and len(digests) == 1:
            return self.image_key(level, digests[0])  # one image alone: its per-image key
        hasher = self._prefix.copy()
        hasher.update(frame(level.encode()) + struct.pack("<Q", len(digests)))
        for digest in digests:
            hasher.update(digest)
        if prompt is None:
            hasher.update(b"\x00")
        else:
            hasher.update(b"\x01" + frame(prompt.encode("utf-8", "surrogatepass")))
        return f"{self.tag}/{level}/{hasher.hexdigest()}"


def is_image_sequence(images: object) -> bool:
    """A list, tuple or other sequence that is not itself one image (str, bytes, memoryview)."""
    if type(images) in (list, tuple):  # the exact types first: this is the hit path
        return True
    return isinstance(images, Sequence) and not isinstance(images, str | bytes | bytearray | memoryview)


class ImageKeys:
    """Image inputs to keys: a `ImageHasher` (content digests) and a `KeyBuilder` (namespace, salt)."""

    def __init__(self, builder: KeyBuilder, hasher: ImageHasher) -> None:
        self.builder = builder
        self.hasher = hasher

    def digests(self, images: Sequence[Any]) -> list[bytes]:
        """The content digest of each image, in order; a typed error for any bad input."""
        if not is_image_sequence(images):
            raise UnsupportedImageTypeError(
                f"images must be a list or tuple of image inputs, got {describe_input(images)}"
            )
        digest = self.hasher.digest
        return [digest(image) for image in images]

    def image_keys(self, level: str, images: Sequence[Any]) -> list[str]:
        """The per-image key of each image in ``level`` (a typed error for any bad input)."""
        if not is_image_sequence(images):
            self.digests(images)  # raises the typed error
        image_key, digest = self.builder.image_key, self.hasher.digest
        return [image_key(level, digest(image)) for image in images]

    def key(self, level: str, images: Sequence[Any], prompt: str | None = None) -> str:
        """The key of ``images`` (in order, possibly none) and ``prompt`` in ``level``."""
        return self.builder.key(level, self.digests(images), prompt)
