"""`ContentId`: an identity the caller already knows, used instead of hashing the content.

Engines that receive a content identifier with a request (vLLM's ``multi_modal_uuids``, SGLang's
``content_hash``) can pass ``ContentId("sha256:…")`` wherever an image is accepted. The ID is hashed
in its own domain, so it never shares a key with any content, URL or other input kind, and it is
namespaced and salted like every key.

The risk is the caller's: visioncache cannot check that an ID names one content. An ID reused for
different content is served the first content's values (vLLM issue #55547 is that bug).
"""

from __future__ import annotations

from dataclasses import dataclass

from visioncache.errors import InvalidArgumentError, UnsupportedInputTypeError, describe_input

__all__ = ["MAX_CONTENT_ID_CHARS", "ContentId"]

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
