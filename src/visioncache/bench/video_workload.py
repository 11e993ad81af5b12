"""Video traffic for ``visioncache bench --video``: multi-turn chats that send a clip every turn.

Why these three: they are how video reaches a serving engine again and again. An agent or a chat
client re-sends the same clip with each turn (``resend``); a live stream is watched through a
window that moves on by a few frames per turn (``sliding``: 16 frames, 2 new per turn, so 7 of
its 8 temporal patches were seen the turn before); and a client may sample the same clip at
another frame rate (``resample``), which changes which frames meet in a patch, so little can be
reused. Frames are a slow pan over a real photo (matplotlib's sample), so neighbouring frames
differ as a camera's do; clips sent as files are MP4 (H.264) made with PyAV.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from visioncache.bench.vocabulary import VIDEO_PLACEHOLDER
from visioncache.bench.workload import ANSWER, QUESTIONS, sample_photos
from visioncache.integrations.video.clip import VideoFrames, VideoInput, VideoSettings
from visioncache.integrations.video.decode import VideoStream, decode_frames, sample_indices

__all__ = ["WORKLOADS", "VideoRequest", "VideoWorkload", "build_video_workloads", "video_prompt"]

WORKLOADS = ("resend", "sliding", "resample")
WINDOW, STRIDE = 16, 2  # frames per window, new frames per turn (sliding)
SOURCE_FPS, SAMPLE_FPS = 4, 2  # the MP4's rate, and the rate visioncache samples it at
RESAMPLE_FPS = (2.0, 3.0, 1.0, 2.5, 1.5, 3.5)  # the client's sampling rate per turn (resample)


@dataclass(frozen=True)
class VideoRequest:
    """One turn: the conversation's prompt (ChatML, one video placeholder) and its video."""

    prompt: str
    video: VideoInput
    frames: int  # frames the video holds once sampled


@dataclass(frozen=True)
class VideoWorkload:
    name: str
    description: str
    requests: tuple[VideoRequest, ...]


def video_prompt(turn: int, latest: bool) -> str:
    """A conversation of ``turn + 1`` user turns; the video sits in the first user message, or
    in the latest one (``latest``: a live view replaces the previous ones)."""
    parts = []
    for index in range(turn + 1):
        video = VIDEO_PLACEHOLDER if (index == turn if latest else index == 0) else ""
        parts.append(f"<|im_start|>user\n{video}{QUESTIONS[index % len(QUESTIONS)]}<|im_end|>\n")
        if index < turn:
            parts.append(f"<|im_start|>assistant\n{ANSWER}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


def pan_frames(count: int, width: int) -> list[np.ndarray]:
    """``count`` frames of ``width`` x ``3/4 width`` pixels panning right over a real photo, a
    few pixels a frame."""
    photo = Image.fromarray(sample_photos()[0][1])
    height = width * 3 // 4
    scale = 1.5 * height / photo.height  # the crop window is 2/3 of the photo's height
    photo = photo.resize((max(round(photo.width * scale), width + count * 4), round(photo.height * scale)))
    step = (photo.width - width) / max(count - 1, 1)
    top = (photo.height - height) // 2
    pixels = np.asarray(photo)
    return [
        pixels[top : top + height, round(i * step) : round(i * step) + width].copy() for i in range(count)
    ]


def mp4_bytes(frames: list[np.ndarray], fps: int) -> bytes:
    """The frames as an H.264 MP4 file."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


def build_video_workloads(
    turns: int, frame_width: int, settings: VideoSettings, names: tuple[str, ...] = WORKLOADS
) -> list[VideoWorkload]:
    """The named workloads, ``turns`` turns each. The file clips last ``WINDOW / SAMPLE_FPS``
    seconds at ``SOURCE_FPS``, so ``settings.fps == SAMPLE_FPS`` samples ``WINDOW`` frames."""
    if turns < 2 or frame_width < 56:
        raise ValueError("the video bench needs turns >= 2 and a frame width >= 56")
    stream = pan_frames(WINDOW + STRIDE * (turns - 1), frame_width)
    source = WINDOW * SOURCE_FPS // SAMPLE_FPS
    # Only the file workloads need the MP4 (and PyAV to write it): `sliding` sends frames.
    files = {"resend", "resample"} & set(names)
    clip = mp4_bytes(pan_frames(source, frame_width), SOURCE_FPS) if files else b""
    workloads = []
    for name in names:
        if name == "resend":
            low, high = settings.min_frames, settings.max_frames
            sampled = len(sample_indices(VideoStream(source, SOURCE_FPS), settings.fps, low, high, 2))
            requests = [VideoRequest(video_prompt(t, latest=False), clip, sampled) for t in range(turns)]
            description = f"the same {source}-frame MP4 re-sent each turn"
        elif name == "sliding":
            requests = []
            for t in range(turns):
                window = stream[t * STRIDE : t * STRIDE + WINDOW]
                frames = VideoFrames(
                    window, fps=SOURCE_FPS, frame_indices=range(t * STRIDE, t * STRIDE + WINDOW)
                )
                requests.append(VideoRequest(video_prompt(t, latest=True), frames, WINDOW))
            description = f"a live window of {WINDOW} frames sliding by {STRIDE} frames per turn"
        elif name == "resample":
            requests = []
            for t in range(turns):
                fps = RESAMPLE_FPS[t % len(RESAMPLE_FPS)]
                indices = sample_indices(VideoStream(source, SOURCE_FPS), fps, 4, 768, 2)
                frames = VideoFrames(decode_frames(clip, indices), fps=SOURCE_FPS, frame_indices=indices)
                requests.append(VideoRequest(video_prompt(t, latest=False), frames, len(indices)))
            description = "the same clip re-sampled by the client at another fps each turn"
        else:
            raise ValueError(f"unknown video workload {name!r}; choose from {WORKLOADS}")
        workloads.append(VideoWorkload(name, description, tuple(requests)))
    return workloads
