"""The uncached reference for video tests: transformers' own model path on a whole clip.

Everything but the frames' pixels comes from transformers itself: the prompt text from the
processor's ``replace_video_token`` (its stock video processor needs torchvision, absent here, so
a stand-in gives it the two numbers it reads), the vision tower from the model's own
``pixel_values_videos`` path, in one call for the whole clip. The pixels come from
``clip_pixels`` (the image processor per frame), which the cached path uses per frame too.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers.video_utils import VideoMetadata

from visioncache.integrations.transformers.video_pixels import clip_pixels
from visioncache.integrations.video.clip import VideoFrames, VideoSettings

VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def chat(content: str, question: str = "describe the image") -> str:
    """A one-turn ChatML prompt."""
    return f"<|im_start|>user\n{content}{question}<|im_end|>\n<|im_start|>assistant\n"


def noise_frames(count: int, height: int = 56, width: int = 84, seed: int = 0) -> list[np.ndarray]:
    """``count`` distinct RGB frames (a stream: frame i is the same for every call with ``seed``)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]


def reference_inputs(
    model: Any,
    processor: Any,
    text: str,
    images: Sequence[Image.Image] = (),
    videos: Sequence[VideoFrames] = (),
    settings: VideoSettings | None = None,
) -> dict[str, Any]:
    """Model inputs for transformers' own path: pixel values, no cached encoder output."""
    settings = settings or VideoSettings()
    temporal = model.config.vision_config.temporal_patch_size
    inputs: dict[str, Any] = {}
    image_text: list[str] = []
    video_text: list[str] = []
    if images:
        output = processor.image_processor(images=list(images), return_tensors="pt")
        inputs["pixel_values"], inputs["image_grid_thw"] = output["pixel_values"], output["image_grid_thw"]
        image_text = [processor.replace_image_token(output, image_idx=i) for i in range(len(images))]
    if videos:
        clips = [clip_pixels(processor.image_processor, video.frames, settings, temporal) for video in videos]
        inputs["pixel_values_videos"] = torch.cat([pixels for pixels, _ in clips])
        inputs["video_grid_thw"] = torch.stack([grid for _, grid in clips])
        metadata = [
            VideoMetadata(
                total_num_frames=None,
                fps=video.fps,
                frames_indices=list(video.frame_indices or range(len(video.frames))),
            )
            for video in videos
        ]
        merge = processor.image_processor.merge_size
        processor.video_processor = SimpleNamespace(merge_size=merge, temporal_patch_size=temporal)
        try:
            video_inputs = {"video_grid_thw": inputs["video_grid_thw"], "video_metadata": metadata}
            video_text = [processor.replace_video_token(video_inputs, video_idx=i) for i in range(len(clips))]
        finally:
            del processor.video_processor
        if model.config.model_type == "qwen2_5_vl":
            inputs["second_per_grid_ts"] = torch.tensor([temporal / m.sampled_fps for m in metadata])
    texts, _ = processor.get_text_with_replacements([text], image_text, video_text)
    tokens = processor.tokenizer(texts, padding=True, return_token_type_ids=False, return_tensors="pt")
    inputs.update(tokens)
    inputs["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(tokens["input_ids"]))
    return inputs


def logits(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        result: torch.Tensor = model(**inputs).logits
    return result


def max_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.shape == expected.shape
    return float((actual - expected).abs().max())
