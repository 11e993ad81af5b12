"""Engine-agnostic video: clips, frame sampling and decoding (PyAV), temporal patches."""

from visioncache.integrations.video.clip import VideoFrames, VideoInput, VideoSettings

__all__ = ["VideoFrames", "VideoInput", "VideoSettings"]
