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

A request opens each of its handles once (`Handles.held_open`): it pins the features first, and only
where they are gone reads, verifies and holds the kept bytes (a `KeptImage`). What it opened is
what its scheduler step resolves the handle to (`Handles.resolve`): nothing is opened, read or
hashed again, and a warm handle hashes nothing at all.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field

from visioncache import ContentDigest, VisionEmbeddingCache, forking
from visioncache.integrations.handles.handle_codec import (
    HandleCodec,
    HandleError,
    HandleExpiredError,
    MediaKind,
)
from visioncache.tiers import TierSettings

__all__ = ["BYTES_NAMESPACE", "DigestedImage", "HandleStats", "Handles", "Issued", "KeptImage"]

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


@dataclass(frozen=True, slots=True, repr=False)
class DigestedImage(ContentDigest):
    """An image's bytes with the content digest already computed from them: wherever an image is
    accepted it is keyed by ``digest`` (nothing hashed again), and an encoder reads ``data``."""

    data: bytes = field(compare=False)


@dataclass(frozen=True, slots=True, repr=False)
class KeptImage(DigestedImage):
    """A handle's kept bytes, read back and verified against its digest (features were gone)."""


@dataclass(frozen=True, slots=True)
class Issued:
    """One uploaded image's handle, and whether its bytes are kept (``reason`` when not)."""

    handle: str
    kept: bool
    reason: str | None = None


class _Opened:
    """The handles requests hold open, each with what it resolves to, counted by holder."""

    def __init__(self) -> None:
        self._lock = forking.lock()  # a leaf: only the map's own operations run under it
        self._held: dict[str, tuple[int, ContentDigest]] = {}

    def add(self, handle: str, item: ContentDigest) -> None:
        with self._lock:
            count, held = self._held.get(handle, (0, item))
            # Bytes read and verified serve every holder: keep them over a bare digest.
            self._held[handle] = (count + 1, item if isinstance(item, KeptImage) else held)

    def remove(self, handle: str) -> None:
        with self._lock:
            count, held = self._held[handle]
            if count == 1:
                del self._held[handle]
            else:
                self._held[handle] = (count - 1, held)

    def get(self, handle: str) -> ContentDigest | None:
        with self._lock:
            found = self._held.get(handle)
        return None if found is None else found[1]


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
        self._opened = _Opened()

    def for_tenant(self, salt: str | None) -> Handles:
        """Another tenant's handles: sealed and kept under ``salt``, in the same kept-bytes cache
        (one memory budget) and counters."""
        view = copy.copy(self)
        view.codec = HandleCodec(salt)
        view.kept = self.kept.with_salt(salt)
        view._opened = _Opened()  # a handle string opens under one tenant only
        return view

    # ---- issuing -------------------------------------------------------------------------------
    def issue(self, images: Sequence[bytes]) -> list[tuple[str, bytes]]:
        """Hash and keep each image's bytes; its (handle, content digest), in order."""
        digests = self.kept.image_digests(images)
        issued = self.keep([DigestedImage(d, image) for d, image in zip(digests, images, strict=True)])
        return [(one.handle, digest) for one, digest in zip(issued, digests, strict=True)]

    def keep(self, images: Sequence[DigestedImage], kind: MediaKind = "image") -> list[Issued]:
        """Keep each image's (or video's: ``kind``) bytes (hashed already: nothing is hashed here)
        and return its handle, in order, with whether the bytes are kept: with no tier, an image the
        kept-bytes memory cannot take is not, and its handle serves only while its features are
        cached (a video's, never: a video is served from its kept bytes)."""
        items = [ContentDigest(image.digest) for image in images]
        self.kept.set_image_embeddings(items, [image.data for image in images])
        self.stats.handles_issued += len(images)
        tiered = self.kept.tiers is not None
        in_memory = [] if tiered else [value is not None for value in self.kept.get_image_embeddings(items)]
        not_kept = _NOT_KEPT_VIDEO if kind == "video" else _NOT_KEPT
        return [
            Issued(self.codec.seal(image.digest, kind), True)
            if tiered or in_memory[index]
            else Issued(self.codec.seal(image.digest, kind), False, not_kept.format(size=len(image.data)))
            for index, image in enumerate(images)
        ]

    # ---- resolving -----------------------------------------------------------------------------
    def digest(self, handle: str, kind: MediaKind = "image") -> bytes:
        """The content digest ``handle`` seals as a ``kind`` handle (`HandleError` for a malformed,
        unknown or other-kind one)."""
        try:
            return self.codec.open(handle, kind)
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

    def resolve(self, handle: str) -> ContentDigest:
        """What ``handle`` stands for in a scheduler step: what the request holding it open found
        (`held_open`: its digest, or its verified kept bytes), else its digest, opened now."""
        found = self._opened.get(handle)
        return found if found is not None else ContentDigest(self.digest(handle))

    @contextmanager
    def held_open(
        self, handles: Sequence[str], engine_caches: Sequence[VisionEmbeddingCache]
    ) -> Iterator[None]:
        """Open each of ``handles`` once, and inside the block keep it servable (`held`) and what
        it resolves to ready for the request's scheduler step (`resolve`). Raises the first
        handle's `HandleError` (malformed, unknown, expired) before the block."""
        opened = {handle: self.digest(handle) for handle in dict.fromkeys(handles)}  # each once
        digests = [opened[handle] for handle in handles]
        with self.held(digests, engine_caches) as items, ExitStack() as registered:
            for handle, item in dict(zip(handles, items, strict=True)).items():
                self._opened.add(handle, item)
                registered.callback(self._opened.remove, handle)
            yield

    @contextmanager
    def held(
        self, digests: Sequence[bytes], engine_caches: Sequence[VisionEmbeddingCache]
    ) -> Iterator[list[ContentDigest]]:
        """Inside the block, every one of ``digests`` stays servable: its features are pinned in
        ``engine_caches`` (found in memory, else their tiers); only where no engine holds them are
        its kept bytes pinned, read and verified. Yields what each digest resolves to: a
        ``ContentDigest``, or a `KeptImage` holding the verified bytes. `HandleExpiredError`
        (before the block) when one has neither.

        Before vllm-mlx has built its engine there are no features to find: the kept bytes are read.
        """
        found: dict[bytes, ContentDigest] = {}
        with ExitStack() as pins:
            for digest in dict.fromkeys(digests):
                item = ContentDigest(digest)
                if not any(self._holds_features(cache, item, pins) for cache in engine_caches):
                    pins.enter_context(self.kept.pinned([item]))
                    data = self.kept_bytes(digest)
                    if data is None:
                        self.stats.handles_missing += 1
                        raise _expired()
                    item = KeptImage(digest, data)
                found[digest] = item
            self.stats.handles_resolved += len(digests)
            yield [found[digest] for digest in digests]

    @staticmethod
    def _holds_features(cache: VisionEmbeddingCache, item: ContentDigest, pins: ExitStack) -> bool:
        """Pins ``item``'s features in ``cache`` and says whether it holds them."""
        pins.enter_context(cache.pinned([item]))
        return cache.get_image_embeddings([item])[0] is not None

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


_NOT_KEPT = (
    "not kept: no disk or Redis tier is configured and the kept-bytes memory "
    "(--vision-cache-max-handle-bytes) could not take these {size} bytes; the handle is served "
    "while the image's features are cached, then answers 410 (send the image again)"
)

_NOT_KEPT_VIDEO = (
    "not kept: no disk or Redis tier is configured and the kept-bytes memory "
    "(--vision-cache-max-handle-bytes) could not take these {size} bytes; a video's handle is "
    "served from its kept bytes only, so this one answers 410 (send the video inline)"
)


def _expired() -> HandleExpiredError:
    return HandleExpiredError(
        "image handle expired: this server no longer holds the image's features or bytes; send "
        "the image again (inline, or POST /v1/visioncache/images for a new handle)"
    )
