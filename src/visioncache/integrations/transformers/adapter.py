"""Hugging Face transformers adapter: cached preprocessing and vision-encoder output for Qwen VLMs.

Why: the vision tower is the expensive part of a multimodal prefill and depends only on the image,
yet transformers recomputes it for every request. ``CachedVisionModel`` puts a
``VisionEmbeddingCache`` in front of Qwen2-VL, Qwen2.5-VL and Qwen3-VL: the image processor runs
only on images whose pixels are not cached, the vision tower only on images whose embeddings are
not cached (all of a batch's misses in one call), and the text is tokenised per request with each
image placeholder expanded from the image's grid, which the embedding entry carries, so an
embedding hit skips preprocessing too. The cached outputs reach the model through
``mm_encoder_outputs``, the path transformers itself uses after encoding, so a hit gives the same
logits as a miss. Videos are cached per temporal patch (``hf_video``). All caching logic stays in
the core.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, ProcessorMixin
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

from visioncache import PixelOnlyCacheEntry, VisionEmbeddingCache
from visioncache.errors import ConfigurationError, PlaceholderMismatchError
from visioncache.integrations.transformers.images import ImageInput, load_pil_image
from visioncache.integrations.transformers.model import (
    DEEPSTACK_FAMILIES,
    StageTimes,
    model_family,
    model_namespace,
)
from visioncache.integrations.transformers.video import VideoEncoder, VideoOutput, video_replacement
from visioncache.integrations.video import VideoInput, VideoSettings

__all__ = ["CachedVisionModel"]

# (text, images) or (text, images, videos); each placeholder in the text stands for the next one.
Request = tuple[str, Sequence[ImageInput]] | tuple[str, Sequence[ImageInput], Sequence[VideoInput]]


class CachedVisionModel:
    """Builds a Qwen VLM's model inputs with cached per-image and per-temporal-patch vision output.

    ``prepare(text, images, videos)`` / ``prepare_batch(requests)`` return keyword arguments for
    ``model(**inputs)`` and ``model.generate(**inputs)``; the logits equal those of the model on
    the same pixels uncached. Each ``<|image_pad|>`` in a text stands for the next image and each
    ``<|video_pad|>`` for the next video, in order. Without ``cache``, one is built with
    ``model_namespace(model, processor)`` (or ``namespace``); a passed cache is used as it is, so
    build it with that namespace. ``video_settings`` sets video sampling and resolution.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        processor: ProcessorMixin,
        cache: VisionEmbeddingCache | None = None,
        namespace: str | None = None,
        video_settings: VideoSettings | None = None,
    ) -> None:
        self.family = model_family(model)
        if cache is not None and namespace is not None:
            raise ConfigurationError(
                "pass namespace= to the VisionEmbeddingCache, not to CachedVisionModel, when passing a cache"
            )
        self.model = model
        self.processor = processor
        self.cache = (
            cache
            if cache is not None
            else VisionEmbeddingCache(namespace=namespace or model_namespace(model, processor))
        )
        self.times = StageTimes()
        self.video_settings = video_settings or VideoSettings()
        self._video: VideoEncoder | None = None  # built on the first video (it checks the model)
        self._image_token: str = processor.image_token  # type: ignore[attr-defined]
        self._video_token: str = processor.video_token  # type: ignore[attr-defined]

    def prepare(
        self, text: str, images: Sequence[ImageInput] = (), videos: Sequence[VideoInput] = ()
    ) -> dict[str, Any]:
        """Model inputs for one request."""
        return self.prepare_batch([(text, images, videos)])

    def prepare_batch(self, requests: Sequence[Request]) -> dict[str, Any]:
        """Model inputs for a padded batch of requests; their misses encode in one call per kind."""
        texts = [request[0] for request in requests]
        images = [request[1] for request in requests]
        videos = [request[2] if len(request) > 2 else () for request in requests]
        self._check_placeholders(texts, [len(i) for i in images], [len(v) for v in videos])
        video_values = self.video_outputs(videos) if any(videos) else [[] for _ in requests]
        return self._build_inputs(texts, self.image_outputs(images), video_values)

    def image_outputs(
        self,
        images_per_request: Sequence[Sequence[ImageInput]],
    ) -> list[list[dict[str, Any]]]:
        """Per request, each image's cached vision output (embeddings, grid, deepstack features);
        the misses of all requests are preprocessed and encoded in one call each."""
        return self.cache.encode_batch([list(images) for images in images_per_request], self._encode)

    def video_outputs(self, videos_per_request: Sequence[Sequence[VideoInput]]) -> list[list[VideoOutput]]:
        """Per request, each video's output, cached per temporal patch; the missing patches of all
        requests are encoded in one call. The first call checks that the model's vision
        attention stays within a temporal patch (ConfigurationError if not)."""
        if self._video is None:
            self._video = VideoEncoder(
                self.model, self.processor, self.cache, self.video_settings, self.times
            )
        return self._video.outputs(videos_per_request)

    def model_inputs(
        self,
        texts: Sequence[str],
        values_per_request: Sequence[Sequence[dict[str, Any]]],
        videos_per_request: Sequence[Sequence[VideoOutput]] | None = None,
    ) -> dict[str, Any]:
        """Model inputs from texts and what ``image_outputs`` / ``video_outputs`` returned."""
        videos = videos_per_request if videos_per_request is not None else [[] for _ in texts]
        self._check_placeholders(texts, [len(v) for v in values_per_request], [len(v) for v in videos])
        return self._build_inputs(list(texts), values_per_request, videos)

    def _check_placeholders(self, texts: Sequence[str], images: list[int], videos: list[int]) -> None:
        for text, image_count, video_count in zip(texts, images, videos, strict=True):
            checks = ((self._image_token, image_count, "images"), (self._video_token, video_count, "videos"))
            for token, count, kind in checks:
                placeholders = text.count(token)
                if placeholders != count:
                    raise PlaceholderMismatchError(
                        f"a prompt has {placeholders} {token} placeholders but {count} {kind} "
                        "were sent with it"
                    )

    def _preprocess(self, images: list[ImageInput]) -> list[PixelOnlyCacheEntry]:
        """The image processor on the images whose pixels missed, split back per image."""
        start = time.perf_counter()
        image_processor: Any = self.processor.image_processor
        output = image_processor(images=[load_pil_image(image) for image in images], return_tensors="pt")
        grids = output["image_grid_thw"]
        rows = torch.split(output["pixel_values"], grids.prod(-1).tolist())
        elapsed = time.perf_counter() - start
        self.times.add(preprocess=elapsed, preprocessed=len(images))
        return [
            PixelOnlyCacheEntry(
                pixel_values=pixels.clone(),
                image_grid_thw=grid.clone(),
                processing_time=elapsed / len(images),
            )
            for pixels, grid in zip(rows, grids, strict=True)
        ]

    def _encode(self, images: list[ImageInput]) -> list[dict[str, Any]]:
        """The vision tower on the images whose embeddings missed, in one call, split per image."""
        entries = self.cache.preprocess_images(images, self._preprocess)
        model: Any = self.model
        pixel_values = torch.cat([torch.as_tensor(entry.pixel_values) for entry in entries])
        grids = torch.stack([torch.as_tensor(entry.image_grid_thw) for entry in entries])
        start = time.perf_counter()
        # no_grad, not inference_mode: cached tensors must stay usable in a later autograd forward.
        with torch.no_grad():
            output = model.get_image_features(pixel_values.to(model.device), grids.to(model.device))
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)  # time the tower's work, not just its launch
        self.times.add(encode=time.perf_counter() - start, encoded=len(images))
        values: list[dict[str, Any]] = []
        for index, grid in enumerate(grids):
            # clone: a slice of the batch output would keep the whole batch's storage alive.
            value = {"embeddings": output.pooler_output[index].clone(), "image_grid_thw": grid.clone()}
            if self.family in DEEPSTACK_FAMILIES:
                value["deepstack_features"] = [layer[index].clone() for layer in output.deepstack_features]
            values.append(value)
        return values

    def _build_inputs(
        self,
        texts: list[str],
        values_per_request: Sequence[Sequence[dict[str, Any]]],
        videos_per_request: Sequence[Sequence[VideoOutput]],
    ) -> dict[str, Any]:
        """Tokenised texts (placeholders expanded from the cached grids) plus the cached outputs."""
        processor: Any = self.processor
        values = [value for values in values_per_request for value in values]
        videos = [video for videos in videos_per_request for video in videos]
        inputs: dict[str, Any] = {}
        encoder_outputs: dict[str, Any] = {}
        image_replacements: list[str] = []
        if values:
            grids = torch.stack([value["image_grid_thw"] for value in values])
            image_replacements = [
                processor.replace_image_token({"image_grid_thw": grids}, image_idx=index)
                for index in range(len(values))
            ]
            inputs["image_grid_thw"] = grids
            encoder_outputs["image"] = self._encoder_output(
                [value["embeddings"] for value in values],
                [value.get("deepstack_features") for value in values],
            )
        video_replacements = [video_replacement(self.family, video, processor) for video in videos]
        if videos:
            inputs["video_grid_thw"] = torch.stack([video.grid for video in videos])
            encoder_outputs["video"] = self._encoder_output(
                [video.embeddings for video in videos], [video.deepstack_features for video in videos]
            )
            if self.family == "qwen2_5_vl":
                inputs["second_per_grid_ts"] = torch.tensor([video.seconds_per_patch for video in videos])
        if encoder_outputs:
            texts, _ = processor.get_text_with_replacements(
                list(texts), image_replacements, video_replacements
            )
            inputs["mm_encoder_outputs"] = encoder_outputs
        tokens = processor.tokenizer(texts, padding=True, return_token_type_ids=False, return_tensors="pt")
        inputs.update(tokens)
        inputs["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(tokens["input_ids"]))
        device = self.model.device
        return {
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in inputs.items()
        }

    def _encoder_output(
        self, embeddings: list[torch.Tensor], deepstack: list[list[torch.Tensor] | None]
    ) -> BaseModelOutputWithPooling:
        """One image's or video's embeddings per item, as transformers' encoder output of a kind."""
        # Qwen models take one tensor per item here, though transformers annotates one tensor.
        pooled: Any = tuple(embeddings)
        if self.family not in DEEPSTACK_FAMILIES:
            return BaseModelOutputWithPooling(pooler_output=pooled)
        layers = len(deepstack[0] or [])
        per_layer: Any = [
            tuple(item[layer] for item in deepstack if item is not None) for layer in range(layers)
        ]
        return BaseModelOutputWithDeepstackFeatures(pooler_output=pooled, deepstack_features=per_layer)
