"""The server's image handles: issuing them for uploaded images, keeping the images' bytes, and
turning handles in requests back into content.

A handle (`handle_codec`) seals the image's content digest under the tenant salt, so the engine
looks features and KV up by that digest exactly as for the same image sent inline
(``ContentDigest``), without the bytes. The bytes are kept for the day the features are evicted:
in a `VisionEmbeddingCache` of their own (namespace `BYTES_NAMESPACE`, the tenant salt, the
engine's tier settings), whose per-image level holds each image's encoded bytes. So they are
bounded (``max_handle_bytes`` in memory, each tier's own budget below), shared by a host's
processes (disk) and by replicas (Redis), kept across restarts, and keyed like every entry. They do
not depend on the model: after a model change a handle still resolves, its features encoded again
from the bytes. Bytes read back are hashed again and must give the handle's digest, or they count
as missing: a damaged or tampered tier can make a handle expire, never mean another image.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from visioncache import ContentDigest, VisionEmbeddingCache
from visioncache.integrations.vllm_mlx.handle_codec import HandleCodec, HandleError, HandleExpiredError
from visioncache.tiers import TierSettings

__all__ = ["BYTES_NAMESPACE", "HandleStats", "Handles"]

BYTES_NAMESPACE = "visioncache vllm-mlx image handles: image bytes v1"


@dataclass
class HandleStats:
    """What happened to handles (reported beside the engine's counters); updated on the server's
    event-loop thread only (the upload route, the handle check and the scheduler step all run there)."""

    handles_issued: int = 0  # images uploaded (uploading one image again counts again)
    handles_resolved: int = 0  # handles in requests that were served
    handles_missing: int = 0  # handles answered 410: neither features nor bytes held any more
    handles_refused: int = 0  # malformed (400) or unknown (404: forged, guessed, another tenant's)
    handle_images_from_kept_bytes: int = 0  # evicted features encoded again from the kept bytes
    handle_bytes_corrupt: int = 0  # kept bytes read back whose digest was not the handle's

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Handles:
    """One tenant's handles: its codec, the kept bytes, the counters.

    Args:
        salt: the tenant salt (the engine cache's); None seals under a public key.
        tiers: where kept bytes live below memory (the engine's tier settings).
        max_bytes: memory budget of the kept bytes (an int or a size such as ``"512MiB"``).
    """

    def __init__(self, salt: str | None, tiers: TierSettings | None, max_bytes: int | str) -> None:
        self.codec = HandleCodec(salt)
        self.stats = HandleStats()
        self.kept = VisionEmbeddingCache(
            0,
            0,
            namespace=BYTES_NAMESPACE,
            salt=salt,
            max_pixel_bytes=0,
            max_encoding_bytes=0,
            max_embedding_entries=None,
            max_embedding_bytes=max_bytes,
            tiers=tiers,
        )

    def for_tenant(self, salt: str | None) -> Handles:
        """Another tenant's handles: sealed and kept under ``salt``, in the same kept-bytes cache
        (one memory budget) and counters."""
        view = copy.copy(self)
        view.codec = HandleCodec(salt)
        view.kept = self.kept.with_salt(salt)
        return view

    # ---- issuing -------------------------------------------------------------------------------
    def issue(self, images: Sequence[bytes]) -> list[tuple[str, bytes]]:
        """Keep each image's bytes and return its (handle, content digest), in order."""
        digests = self.kept.image_digests(images)
        self.kept.set_image_embeddings([ContentDigest(digest) for digest in digests], list(images))
        self.stats.handles_issued += len(images)
        return [(self.codec.seal(digest), digest) for digest in digests]

    # ---- resolving -----------------------------------------------------------------------------
    def digest(self, handle: str) -> bytes:
        """The content digest ``handle`` seals (`HandleError` for a malformed or unknown one)."""
        try:
            return self.codec.open(handle)
        except HandleError:
            self.stats.handles_refused += 1
            raise

    def kept_bytes(self, digest: bytes) -> bytes | None:
        """The bytes kept for ``digest`` (memory, then the tiers), checked against it; or None."""
        (value,) = self.kept.get_image_embeddings([ContentDigest(digest)])
        if value is None:
            return None
        data = bytes(value)
        if self.kept.image_digests([data])[0] != digest:
            self.stats.handle_bytes_corrupt += 1
            return None
        return data

    def encode_source(self, item: ContentDigest) -> bytes:
        """What the encoder reads for a handle whose features are missing: its kept bytes."""
        data = self.kept_bytes(item.digest)
        if data is None:
            self.stats.handles_missing += 1
            raise _expired()
        self.stats.handle_images_from_kept_bytes += 1
        return data

    @contextmanager
    def held(self, digests: Sequence[bytes], engine_caches: Sequence[VisionEmbeddingCache]) -> Iterator[None]:
        """Inside the block, every one of ``digests`` stays servable: its kept bytes, or else its
        features in one of ``engine_caches``, are pinned in memory. `HandleExpiredError` (before
        the block) when one has neither.

        The features are looked for only when the bytes are gone (a tier hit then counts once
        here and once when the engine uses it), and only in engines already built: before
        vllm-mlx has built its engine, a handle whose bytes are gone answers expired.
        """
        with ExitStack() as pins:
            for digest in dict.fromkeys(digests):
                item = [ContentDigest(digest)]
                pins.enter_context(self.kept.pinned(item))
                if self.kept_bytes(digest) is not None:
                    continue
                if not any(self._holds_features(cache, item, pins) for cache in engine_caches):
                    self.stats.handles_missing += 1
                    raise _expired()
            self.stats.handles_resolved += len(digests)
            yield

    @staticmethod
    def _holds_features(cache: VisionEmbeddingCache, item: list[Any], pins: ExitStack) -> bool:
        pins.enter_context(cache.pinned(item))
        return cache.get_image_embeddings(item)[0] is not None

    def counters(self) -> dict[str, int]:
        """`HandleStats` plus what the kept bytes hold in memory (``handle_bytes_*``)."""
        kept = self.kept.snapshot().levels["embedding"]
        return {
            **self.stats.as_dict(),
            "handle_bytes_entries": kept.entries,
            "handle_bytes_held": kept.bytes,
            "handle_bytes_evictions": kept.evictions,
        }

    def close(self) -> None:
        """Flush the kept bytes' pending tier writes and close their tiers."""
        self.kept.close()


def _expired() -> HandleExpiredError:
    return HandleExpiredError(
        "image handle expired: this server no longer holds the image's features or bytes; send "
        "the image again (inline, or POST /v1/visioncache/images for a new handle)"
    )
