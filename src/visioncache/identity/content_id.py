"""Identities the caller already holds, used instead of hashing the content.

`ContentId`: engines that receive a content identifier with a request (vLLM's
``multi_modal_uuids``, SGLang's ``content_hash``) can pass ``ContentId("sha256:…")`` wherever an
image is accepted. The ID is hashed in its own domain, so it never shares a key with any content or
other input kind, and it is namespaced and salted like every key.

`ContentDigest`: a digest visioncache itself computed for some content (``image_digests``), kept
instead of the content (serve-mlx's image handles decrypt to one). It IS that content's identity:
the same image given inline hits the same entries, and the content is not read.

The risk is the caller's for both: visioncache cannot check that an ID or a digest names the
content meant. An ID reused for different content is served the first content's values (vLLM issue
#55547 is that bug); a digest of other content is served that content's values.
"""

from __future__ import annotations

from dataclasses import dataclass

from visioncache.errors import InvalidArgumentError, UnsupportedInputTypeError, describe_input
from visioncache.identity.framing import DIGEST_SIZE

__all__ = ["MAX_CONTENT_ID_CHARS", "ContentDigest", "ContentId"]

MAX_CONTENT_ID_CHARS = 1024


@dataclass(frozen=True, slots=True)
class ContentId:
    """A caller-supplied content identifier: a non-empty str of at most 1024 characters.

    Two ``ContentId`` with equal values are one entry; a ``ContentId`` never equals the digest of
    any bytes, file, ``data:`` URL or http(s) URL, even one whose text is the same.
    """

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str):
            raise UnsupportedInputTypeError(
                f"ContentId takes a str (e.g. 'sha256:<hex>'), got {describe_input(self.value)}; "
                "convert numeric IDs with str()"
            )
        if not self.value.strip() or len(self.value) > MAX_CONTENT_ID_CHARS:
            raise InvalidArgumentError(
                f"ContentId must be a non-blank str of at most {MAX_CONTENT_ID_CHARS} characters, "
                f"got {describe_input(self.value)}"
            )

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class ContentDigest:
    """The 32-byte content digest visioncache computed for some content (``cache.image_digests``).

    Wherever an image is accepted, it stands for that content: the same entries as the content
    itself, without reading it. An encoder asked to encode a missing ``ContentDigest`` gets the
    object: the caller supplies the content it names.
    """

    digest: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.digest, bytes):
            raise UnsupportedInputTypeError(
                f"ContentDigest takes the bytes image_digests returned, got {describe_input(self.digest)}"
            )
        if len(self.digest) != DIGEST_SIZE:
            raise InvalidArgumentError(
                f"ContentDigest takes a {DIGEST_SIZE}-byte digest, got {len(self.digest)} bytes"
            )

    def __repr__(self) -> str:
        return f"ContentDigest({self.digest.hex()})"
