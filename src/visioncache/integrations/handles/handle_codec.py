"""Image and video handles: ``visioncache://<64 characters>``, the server's sealed name for an
image's (or a video's) content.

A handle is the image's content digest (the 32-byte blake3 digest visioncache keys the image by)
sealed with AES-SIV (RFC 5297, `cryptography`'s ``AESSIV``) under a key derived from the tenant
salt: a 16-byte synthetic IV that authenticates the digest, then the digest encrypted, 48 bytes
in unpadded base64url. AES-SIV is deterministic, so one image has one handle per tenant (an upload
is idempotent, and two clients uploading one image get one handle). Why this construction:

- **content-derived, never a wrong image**: opening a handle gives back exactly the digest the
  server computed from the bytes it was given; features, KV and kept bytes are looked up by that
  digest, as for the same image sent inline;
- **unforgeable and tenant-scoped**: without the salt no one can make a handle that opens (the
  tag is 128 bits), so a guessed or forged handle, or another tenant's (another salt), is refused
  before anything is looked up: it cannot probe which images a tenant holds;
- **reveals nothing**: under a salt, a handle is a pseudorandom string; not even whether two
  tenants' handles name one image. Without a salt the key is public: a handle is then a public
  function of the image, which anyone holding the image can compute (docs/vllm-mlx.md, Threat model);
- **of one kind**: the media kind is sealed with the digest (AES-SIV's associated data), so a
  video's handle opens only where a video goes and an image's only where an image goes
  (`WrongKindHandleError` for the other kind: the media is never read as what it is not).
"""

from __future__ import annotations

import re
import struct
from typing import Literal

import pybase64
from blake3 import blake3

from visioncache import ConfigurationError, InvalidArgumentError, VisionCacheError
from visioncache.extras import requires
from visioncache.identity import DIGEST_SIZE

__all__ = [
    "HANDLE_PREFIX",
    "HandleCodec",
    "HandleError",
    "HandleExpiredError",
    "MalformedHandleError",
    "MediaKind",
    "UnknownHandleError",
    "WrongKindHandleError",
    "is_handle",
]

HANDLE_PREFIX = "visioncache://"
_TOKEN_BYTES = 16 + DIGEST_SIZE  # the synthetic IV, then the encrypted digest
_TOKEN_CHARS = _TOKEN_BYTES * 4 // 3  # base64url, 64 characters: no padding, no spare bits
_TOKEN_PATTERN = re.compile(f"[A-Za-z0-9_-]{{{_TOKEN_CHARS}}}")
_KEY_CONTEXT = "visioncache vllm-mlx image handle key v1"
MediaKind = Literal["image", "video"]
# Sealed with the handle: a video's handle opens only where a video goes, an image's where an image
# goes (the image's associated data is unchanged, so image handles issued before videos still open).
_ASSOCIATED_DATA: dict[MediaKind, list[bytes]] = {
    "image": [b"visioncache image handle v1"],
    "video": [b"visioncache video handle v1"],
}


class HandleError(VisionCacheError):
    """A handle the server cannot serve; ``status`` and ``code`` are its HTTP answer."""

    status = 400
    code = "invalid_image_handle"


class MalformedHandleError(HandleError, InvalidArgumentError):
    """Not a handle at all (wrong prefix, length or alphabet)."""


class UnknownHandleError(HandleError):
    """Well formed, but not issued under this tenant's salt: guessed, forged, another tenant's,
    or issued before the salt was changed."""

    status = 404
    code = "unknown_image_handle"


class WrongKindHandleError(HandleError, InvalidArgumentError):
    """Issued here, for the other kind of media: a video's handle where an image goes, or the reverse."""

    code = "wrong_handle_kind"


class HandleExpiredError(HandleError):
    """Issued here, but the server holds neither the image's features nor its bytes any more."""

    status = 410
    code = "image_handle_expired"


_ARTICLE: dict[MediaKind, str] = {"image": "an image", "video": "a video"}


def is_handle(url: object) -> bool:
    """Whether ``url`` claims to be a handle (its scheme is ``visioncache://``)."""
    return isinstance(url, str) and url.startswith(HANDLE_PREFIX)


def _handle_key(salt: str | bytes | None) -> bytes:
    """The 64-byte AES-SIV key of a tenant (a public constant without a salt)."""
    if salt is not None and not isinstance(salt, str | bytes):
        raise ConfigurationError(f"salt must be str, bytes or None, got {type(salt).__name__}")
    material = salt.encode("utf-8") if isinstance(salt, str) else (salt or b"")
    seeded = struct.pack("<?", salt is not None) + material
    key: bytes = blake3(seeded, derive_key_context=_KEY_CONTEXT).digest(length=64)
    return key


class HandleCodec:
    """Seals digests into handles and opens handles back into digests, for one tenant salt."""

    def __init__(self, salt: str | bytes | None) -> None:
        with requires("handles", "image handles"):
            from cryptography.hazmat.primitives.ciphers.aead import AESSIV

        self._siv = AESSIV(_handle_key(salt))

    def seal(self, digest: bytes, kind: MediaKind = "image") -> str:
        """The handle of the ``kind`` content whose digest is ``digest``."""
        if len(digest) != DIGEST_SIZE:
            raise InvalidArgumentError(f"a handle seals a {DIGEST_SIZE}-byte digest, got {len(digest)} bytes")
        token = self._siv.encrypt(digest, _ASSOCIATED_DATA[kind])
        return HANDLE_PREFIX + pybase64.urlsafe_b64encode(token).decode("ascii").rstrip("=")

    def open(self, handle: str, kind: MediaKind = "image") -> bytes:
        """The digest ``handle`` seals as a ``kind`` handle; `MalformedHandleError`,
        `WrongKindHandleError` (the other kind's handle) or `UnknownHandleError` otherwise."""
        from cryptography.exceptions import InvalidTag

        token = _token(handle)
        try:
            digest: bytes = self._siv.decrypt(token, _ASSOCIATED_DATA[kind])
        except InvalidTag:
            other: MediaKind = "video" if kind == "image" else "image"
            try:
                self._siv.decrypt(token, _ASSOCIATED_DATA[other])
            except InvalidTag:
                pass
            else:
                raise WrongKindHandleError(
                    f"this {other} handle is used where {_ARTICLE[kind]} goes: an image's handle goes "
                    "in an image_url part, a video's (POST /v1/visioncache/videos) in a video_url part"
                ) from None
            raise UnknownHandleError(
                "unknown image handle: it was not issued by this server for this tenant (forged, "
                "mistyped, another tenant's, or issued before the salt changed); upload the image "
                "or video again (POST /v1/visioncache/images or /videos) or send it inline"
            ) from None
        return digest


def _token(handle: str) -> bytes:
    """The 48 bytes a well-formed handle holds (one spelling per token: 64 characters carry no
    spare bits)."""
    text = handle[len(HANDLE_PREFIX) :] if is_handle(handle) else ""
    if not _TOKEN_PATTERN.fullmatch(text):
        raise MalformedHandleError(
            f"malformed image handle {handle[:100]!r}: a handle is {HANDLE_PREFIX!r} followed by "
            f"{_TOKEN_CHARS} base64url characters, as POST /v1/visioncache/images returned it"
        )
    token: bytes = pybase64.urlsafe_b64decode(text)
    return token
