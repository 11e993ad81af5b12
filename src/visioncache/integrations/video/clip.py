"""Video clips: a file's sampled frames by one lookup, and the items that name frames and patches.

Why: a video's vision-encoder output is reused per temporal patch (see
`visioncache.integrations.transformers.video`), so a patch needs a key that names exactly what the
encoder sees. Identity is the cache's own hasher, as for images (`visioncache.identity.video`): a
frame is named by the digest of its decoded RGB pixels (an array: dtype, shape and bytes); a patch
(`VideoPatch`) by the digests of its frames in order, plus ``VideoSettings`` and the model's
temporal patch size, which together decide how those frames are resized, normalised and grouped.
(The resized frame is a function of the decoded frame and those settings, so this names the
resized patch as exactly as a digest of it would, and a hit costs no resize.) A video file is
content: its digest is the hasher's digest of the file (a regular file only, within
``max_image_bytes``, memoised by file state) or of its bytes; the frame digests of its sampled
frames are cached under `VideoFile` in the pixel-only level, so a file sent again costs one hash
(none for an unchanged path) and one lookup, not a decode, until a patch is missing; then only
that patch's frames are converted to pixels.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from visioncache import PixelOnlyCacheEntry, VisionEmbeddingCache
from visioncache.errors import (
    ConfigurationError,
    InvalidImageError,
    UnsupportedImageTypeError,
    describe_input,
)
from visioncache.identity import VideoFile, VideoFrame, VideoPatch
from visioncache.integrations.fingerprint import fingerprint, stable_json
from visioncache.integrations.video.decode import (
    DEFAULT_FPS,
    VideoSource,
    VideoStream,
    decode_frames,
    probe_video,
    sample_indices,
)

__all__ = [
    "Clip",
    "ClipResolver",
    "FrameInput",
    "VideoFrames",
    "VideoInput",
    "VideoSettings",
    "patch_frames",
    "rgb_frame",
    "sample_file",
    "sampled_fps",
]

FrameInput = Image.Image | np.ndarray


@dataclass(frozen=True)
class VideoFrames:
    """Frames already sampled from a video: ``frame_indices`` (default 0, 1, ...) place them in
    the source, and ``fps`` is the source's frame rate (Qwen2.5-VL and Qwen3-VL use both for
    temporal positions and timestamps; the cache keys do not)."""

    frames: Sequence[FrameInput]
    fps: float | None = None
    frame_indices: Sequence[int] | None = None


VideoInput = VideoFrames | Sequence[FrameInput] | str | os.PathLike[str] | bytes


@dataclass(frozen=True)
class VideoSettings:
    """What shapes a video's frames before the encoder: file sampling (``fps`` frames per second,
    clamped to ``[min_frames, max_frames]``) and per-frame resolution bounds in pixels (None: the
    image processor's own ``size``)."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: int | None = None
    max_pixels: int | None = None

    def __post_init__(self) -> None:
        if not self.fps > 0 or self.min_frames < 1 or self.max_frames < self.min_frames:
            raise ConfigurationError(f"invalid video settings: {self}")


def rgb_frame(frame: object) -> np.ndarray:
    """One frame as an RGB uint8 array of shape (H, W, 3): what a decoder yields."""
    if isinstance(frame, Image.Image):
        return np.asarray(frame.convert("RGB"))
    if isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3:
        return frame
    raise UnsupportedImageTypeError(
        f"a video frame must be a PIL image or an RGB uint8 array of shape (H, W, 3), got "
        f"{describe_input(frame) if not isinstance(frame, np.ndarray) else f'{frame.dtype} {frame.shape}'}"
    )


@dataclass
class Clip:
    """One video's sampled frames, by digest; pixels are loaded only for the frames a missing
    patch needs (a warm turn whose patches all hit decodes nothing)."""

    frame_digests: list[bytes]
    frame_indices: list[int]
    fps: float | None
    total_frames: int | None
    _load: Callable[[list[int]], list[np.ndarray]] = field(repr=False)  # source indices -> pixels
    _frames: dict[int, np.ndarray] = field(default_factory=dict, repr=False)  # by position
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def frames_at(self, positions: Sequence[int]) -> list[np.ndarray]:
        """The pixels of the sampled frames at ``positions`` (of ``frame_indices``); each is
        decoded at most once, and only when asked for."""
        with self._lock:
            missing = sorted({at for at in positions if at not in self._frames})
            if missing:
                loaded = self._load([self.frame_indices[at] for at in missing])
                self._frames.update(zip(missing, loaded, strict=True))
            return [self._frames[at] for at in positions]

    @property
    def sampled_fps(self) -> float:
        return sampled_fps(self.fps, len(self.frame_indices), self.total_frames)


def sampled_fps(fps: float | None, frame_count: int, total_frames: int | None) -> float:
    """Sampled frames per second, as transformers' ``VideoMetadata.sampled_fps``."""
    if fps is None or total_frames is None:
        return fps or DEFAULT_FPS
    return frame_count / total_frames * fps


def sample_file(
    source: VideoSource, settings: VideoSettings, temporal_patch_size: int
) -> tuple[list[np.ndarray], list[int], VideoStream]:
    """A video file's frames sampled by ``settings``, their indices, and the stream's facts."""
    stream = probe_video(source)
    indices = sample_indices(
        stream, settings.fps, settings.min_frames, settings.max_frames, temporal_patch_size
    )
    return decode_frames(source, indices), indices, stream


def patch_frames(frame_count: int, first: int, temporal_patch_size: int) -> list[int]:
    """Positions of the frames of the temporal patch starting at frame ``first`` of a clip of
    ``frame_count`` frames; the last frame repeats to fill the final patch, as transformers'
    video processors pad it."""
    return [min(first + step, frame_count - 1) for step in range(temporal_patch_size)]


class ClipResolver:
    """Turns video inputs into ``Clip``s; one cache lookup per batch for the files' frame digests."""

    def __init__(self, cache: VisionEmbeddingCache, settings: VideoSettings, temporal_patch_size: int):
        self.cache = cache
        self.settings = settings
        self.temporal_patch_size = temporal_patch_size
        # Names the settings in every item, so other settings never share an entry.
        self.settings_digest = bytes.fromhex(
            fingerprint(
                ["visioncache/video/settings/v1", stable_json(asdict(settings)), str(temporal_patch_size)]
            )
        )
        self.decoded_files = 0  # files decoded to find their frames (not counting later pixel loads)
        self.loaded_frames = 0  # frames decoded later, for the pixels of a missing patch

    def patch_item(self, clip: Clip, first: int) -> VideoPatch:
        """The item naming the temporal patch starting at frame ``first``."""
        positions = patch_frames(len(clip.frame_digests), first, self.temporal_patch_size)
        return VideoPatch(tuple(clip.frame_digests[at] for at in positions), self.settings_digest)

    def frame_item(self, digest: bytes) -> VideoFrame:
        """The pixel-only level's item for one frame's resized, normalised pixels."""
        return VideoFrame(digest, self.settings_digest)

    def frame_digests(self, frames: Sequence[np.ndarray]) -> list[bytes]:
        """Each decoded frame's digest: the cache's own digest of an array."""
        return self.cache.image_digests(list(frames))

    def resolve(self, videos: Sequence[VideoInput]) -> list[Clip]:
        """A ``Clip`` per video; bad input raises a typed error before the cache is touched."""
        sources = [_classify(video) for video in videos]
        files = [(at, source) for at, source in enumerate(sources) if not isinstance(source, VideoFrames)]
        # A path is handed over as a path (not a str the hasher might read as a URL): a regular
        # file only, read within max_image_bytes, memoised by its state.
        contents = self.cache.image_digests(
            [source if isinstance(source, bytes) else Path(source) for _, source in files]
        )
        items = [VideoFile(content, self.settings_digest) for content in contents]
        by_item = {item: source for item, (_, source) in zip(items, files, strict=True)}
        decoded: dict[VideoFile, list[np.ndarray]] = {}

        def index_files(missing: list[Any]) -> list[PixelOnlyCacheEntry]:
            return [self._index_file(by_item[item], decoded, item) for item in missing]

        entries = self.cache.preprocess_images(items, index_files) if items else []
        clips = [self._frames_clip(source) if isinstance(source, VideoFrames) else None for source in sources]
        for (at, source), item, entry in zip(files, items, entries, strict=True):
            clips[at] = self._file_clip(source, entry, decoded.get(item))
        return [clip for clip in clips if clip is not None]

    def _index_file(
        self, source: VideoSource, decoded: dict[VideoFile, list[np.ndarray]], item: VideoFile
    ) -> PixelOnlyCacheEntry:
        """Decode a file the cache does not know: its sampled frames' digests and sampling facts."""
        frames, indices, stream = sample_file(source, self.settings, self.temporal_patch_size)
        decoded[item] = frames
        self.decoded_files += 1
        index = {
            "frame_digests": np.frombuffer(b"".join(self.frame_digests(frames)), np.uint8).reshape(-1, 32),
            "frame_indices": np.asarray(indices, np.int64),
            "fps": stream.fps,
            "total_frames": stream.total_frames,
        }
        return PixelOnlyCacheEntry(pixel_values=index)

    def _file_clip(
        self, source: VideoSource, entry: PixelOnlyCacheEntry, frames: list[np.ndarray] | None
    ) -> Clip:
        index = entry.pixel_values
        indices = [int(i) for i in np.asarray(index["frame_indices"])]
        digests = [bytes(row) for row in np.asarray(index["frame_digests"], np.uint8)]

        def load(wanted: list[int]) -> list[np.ndarray]:
            self.loaded_frames += len(wanted)
            return decode_frames(source, wanted)

        known = dict(enumerate(frames)) if frames is not None else {}
        return Clip(digests, indices, float(index["fps"]), int(index["total_frames"]), load, known)

    def _frames_clip(self, video: VideoFrames) -> Clip:
        """A clip of frames already converted by ``_classify`` (RGB arrays, indices set)."""
        frames = [rgb_frame(frame) for frame in video.frames]  # no copy: already RGB arrays
        indices = list(video.frame_indices or range(len(frames)))
        return Clip(
            self.frame_digests(frames), indices, video.fps, None, _unreachable, dict(enumerate(frames))
        )


def _unreachable(wanted: list[int]) -> list[np.ndarray]:
    """The loader of a clip whose frames were all given: every position is already known."""
    raise AssertionError(f"frames {wanted} of a clip given as frames were not kept")


def _classify(video: object) -> VideoFrames | VideoSource:
    """A video input as ``VideoFrames`` of RGB arrays (checked) or a file source."""
    if isinstance(video, os.PathLike):
        video = os.fspath(video)
    if isinstance(video, str):
        if not os.path.isfile(video):
            raise InvalidImageError(f"not an existing video file: {describe_input(video)}")
        return video
    if isinstance(video, bytes):
        return video
    if isinstance(video, list | tuple):
        video = VideoFrames(video)
    if not isinstance(video, VideoFrames):
        raise UnsupportedImageTypeError(
            "a video must be a file path, bytes, a list of frames or VideoFrames, got "
            + describe_input(video)
        )
    frames = [rgb_frame(frame) for frame in video.frames]
    if not frames or len({frame.shape for frame in frames}) != 1:
        raise InvalidImageError("a video needs at least one frame, and all its frames must have one size")
    indices = list(video.frame_indices) if video.frame_indices is not None else list(range(len(frames)))
    if len(indices) != len(frames):
        raise InvalidImageError(f"{len(indices)} frame_indices for {len(frames)} frames")
    return VideoFrames(frames, video.fps, indices)
