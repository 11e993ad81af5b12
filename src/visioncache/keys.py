"""Cache keys: namespace + salt + level + ordered image digests (+ prompt digest where it matters).

A key is ``"<namespace tag>/<level>/<64 hex>"``. The tag (32 hex characters, 128 bits of a digest of
the namespace and salt) lets shared tiers list and separate namespaces. For a per-image level the
64 hex are the image's own digest: a hit then costs no hashing beyond the image's. Otherwise they
are a digest over every field, framed, so the order of images, their count and the prompt are all
part of the identity.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from blake3 import blake3

from visioncache.errors import ConfigurationError, UnsupportedInputTypeError, describe_input
from visioncache.identity import frame

__all__ = ["DEFAULT_NAMESPACE", "KEY_FORMAT_VERSION", "KeyBuilder"]

KEY_FORMAT_VERSION = 1
DEFAULT_NAMESPACE = "default"


class KeyBuilder:
    """Composes keys for one (namespace, salt); the shared prefix is hashed once."""

    def __init__(self, namespace: str = DEFAULT_NAMESPACE, salt: str | bytes | None = None):
        if not isinstance(namespace, str) or not namespace:
            raise ConfigurationError(f"namespace must be a non-empty str, got {namespace!r}")
        if salt is not None and not isinstance(salt, str | bytes):
            raise ConfigurationError(f"salt must be str, bytes or None, got {type(salt).__name__}")
        self.namespace = namespace
        self.salt = salt
        salt_bytes = salt.encode() if isinstance(salt, str) else (salt or b"")
        prefix = (
            b"visioncache/key\0"
            + struct.pack("<I", KEY_FORMAT_VERSION)
            + frame(namespace.encode())
            + struct.pack("<?", salt is not None)
            + frame(salt_bytes)
        )
        self._prefix = blake3(prefix)
        self.tag = blake3(prefix).hexdigest()[:32]

    def image_key(self, level: str, digest: bytes) -> str:
        """The key of one image in a per-image level (no other field, so no hashing)."""
        return f"{self.tag}/{level}/{digest.hex()}"

    def key(self, level: str, digests: Sequence[bytes], prompt: str | None = None) -> str:
        """The key of ``level`` for these image digests, in order, and an optional prompt."""
        if prompt is None and len(digests) == 1:
            return self.image_key(level, digests[0])  # one image alone: its digest is the key
        hasher = self._prefix.copy()
        hasher.update(frame(level.encode()) + struct.pack("<Q", len(digests)))
        for digest in digests:
            hasher.update(digest)
        if prompt is None:
            hasher.update(b"\x00")
        else:
            if not isinstance(prompt, str):
                raise UnsupportedInputTypeError(f"prompt must be a str, got {describe_input(prompt)}")
            hasher.update(b"\x01" + frame(prompt.encode("utf-8", "surrogatepass")))
        return f"{self.tag}/{level}/{hasher.hexdigest()}"
