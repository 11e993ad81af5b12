"""Video identity: what names a video file's frame index, a prepared frame and a temporal patch.

Videos go through the same hasher as images: a video file is content, so its digest
is the hasher's digest of its path or bytes (a regular file only, read within ``max_image_bytes``,
memoised by file state, equal for the same bytes in every form), and a decoded frame is an array,
digested with its dtype and shape like any other. What a cache stores for a video is named by the
items below, each hashed by `ImageHasher.digest` under a domain of its own, so no video entry ever
shares a key with an image, a frame with a patch, or a patch of one length with another:

- `VideoFile`: the sampled-frame index of a file (its frames' digests, their indices, the stream's
  rate), under the sampling settings that chose the frames;
- `VideoFrame`: one decoded frame, resized and normalised under the video settings;
- `VideoPatch`: the frames of one temporal patch, in order, under the settings and the model's
  temporal patch size (the vision encoder's output for exactly those frames).

``settings`` is the caller's 32-byte digest of everything that shapes the frames (a
`visioncache.integrations.fingerprint` of the settings and the patch size). The items are frozen
and hashable, so they can key the caller's own dictionaries too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from blake3 import blake3

from visioncache.errors import InvalidArgumentError
from visioncache.identity.framing import domain_key

__all__ = ["VideoFile", "VideoFrame", "VideoItem", "VideoPatch", "video_item_digest"]

_DIGEST_BYTES = 32
_FILE = domain_key("visioncache/video/file/v2")
_FRAME = domain_key("visioncache/video/frame/v2")
_PATCH = domain_key("visioncache/video/patch/v2")


def _check(name: str, digest: object) -> None:
    if not isinstance(digest, bytes) or len(digest) != _DIGEST_BYTES:
        raise InvalidArgumentError(f"{name} must be a 32-byte digest, got {digest!r:.80}")


@dataclass(frozen=True, slots=True)
class VideoFile:
    """A video file's sampled-frame index: the file's content digest, under ``settings``."""

    content: bytes
    settings: bytes

    def __post_init__(self) -> None:
        _check("VideoFile.content", self.content)
        _check("VideoFile.settings", self.settings)


@dataclass(frozen=True, slots=True)
class VideoFrame:
    """One decoded frame (its array digest) as prepared under ``settings``."""

    frame: bytes
    settings: bytes

    def __post_init__(self) -> None:
        _check("VideoFrame.frame", self.frame)
        _check("VideoFrame.settings", self.settings)


@dataclass(frozen=True, slots=True)
class VideoPatch:
    """The frames of one temporal patch (their array digests, in order), under ``settings``."""

    frames: tuple[bytes, ...]
    settings: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.frames, tuple) or not self.frames:
            raise InvalidArgumentError(
                f"VideoPatch.frames must be a non-empty tuple, got {self.frames!r:.80}"
            )
        for digest in self.frames:
            _check("each of VideoPatch.frames", digest)
        _check("VideoPatch.settings", self.settings)


VideoItem = VideoFile | VideoFrame | VideoPatch


def video_item_digest(item: VideoItem) -> bytes:
    """The 32-byte digest of a video item, under its kind's domain (fixed-size fields, counted)."""
    if isinstance(item, VideoFile):
        hasher = blake3(item.settings + item.content, key=_FILE)
    elif isinstance(item, VideoFrame):
        hasher = blake3(item.settings + item.frame, key=_FRAME)
    else:
        hasher = blake3(item.settings + struct.pack("<Q", len(item.frames)), key=_PATCH)
        for digest in item.frames:
            hasher.update(digest)
    return bytes(hasher.digest())
