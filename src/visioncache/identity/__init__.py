"""What names an entry: content digests of every input kind, caller IDs, and key composition.

The face of the identity package: it re-exports, and imports nothing of the store, the tiers, the
levels or the cache.
"""

from visioncache.identity.content_id import MAX_CONTENT_ID_CHARS, ContentDigest, ContentId
from visioncache.identity.digests import compute_image_hash, compute_images_hash
from visioncache.identity.framing import domain_key, frame
from visioncache.identity.hasher import ACCEPTED_INPUTS, DEFAULT_MAX_IMAGE_BYTES, DIGEST_SIZE, ImageHasher
from visioncache.identity.keys import (
    DEFAULT_NAMESPACE,
    KEY_FORMAT_VERSION,
    ImageKeys,
    KeyBuilder,
    is_image_sequence,
)
from visioncache.identity.video import VideoFile, VideoFrame, VideoItem, VideoPatch

__all__ = [
    "ACCEPTED_INPUTS",
    "DEFAULT_MAX_IMAGE_BYTES",
    "DEFAULT_NAMESPACE",
    "DIGEST_SIZE",
    "KEY_FORMAT_VERSION",
    "MAX_CONTENT_ID_CHARS",
    "ContentDigest",
    "ContentId",
    "ImageHasher",
    "ImageKeys",
    "KeyBuilder",
    "VideoFile",
    "VideoFrame",
    "VideoItem",
    "VideoPatch",
    "compute_image_hash",
    "compute_images_hash",
    "domain_key",
    "frame",
    "is_image_sequence",
]
