"""Hugging Face transformers adapter: cached preprocessing and vision-encoder output per image.

Why: the vision tower is the expensive part of a multimodal prefill and depends only on the image,
yet transformers recomputes it for every request. ``CachedVisionModel`` puts a
``VisionEmbeddingCache`` in front of a model of any described family (``families/``): the image
processor runs only on images whose pixels are not cached, the vision tower only on images whose
embeddings are not cached (all of a batch's misses in one call where that is exact), and each
image's placeholder expansion is cached with its embedding, so an embedding hit skips
preprocessing and the processor's counting too. The cached outputs reach the model through
``mm_encoder_outputs``, the path transformers itself uses after encoding, so a hit gives the same
logits as a miss; the load-time check (``exactness.py``) proves it on the loaded model first.
Videos are cached per temporal patch (``video.py``) where the family's tower attends per patch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, ProcessorMixin

from visioncache import ContentId, PixelOnlyCacheEntry, VisionEmbeddingCache
from visioncache.errors import ConfigurationError, PlaceholderMismatchError
from visioncache.integrations.transformers.encoding import FamilyEncoder
from visioncache.integrations.transformers.exactness import Exactness, check_exactness
from visioncache.integrations.transformers.images import ImageInput, load_pil_image
from visioncache.integrations.transformers.model import StageTimes, model_family, model_namespace
from visioncache.integrations.transformers.video import VideoEncoder, VideoOutput, video_inputs
from visioncache.integrations.video import VideoInput, VideoSettings

__all__ = ["CachedVisionModel"]

# (text, images) or (text, images, videos); each placeholder in the text stands for the next one.
Request = tuple[str, Sequence[ImageInput]] | tuple[str, Sequence[ImageInput], Sequence[VideoInput]]


class CachedVisionModel:
    """Builds a VLM's model inputs with cached per-image (and per-temporal-patch) vision output.

    ``prepare(text, images, videos)`` / ``prepare_batch(requests)`` return keyword arguments for
    ``model(**inputs)`` and ``model.generate(**inputs)``; the logits equal those of the model on
    the same pixels uncached. Each of the processor's image placeholders (``processor.image_token``:
    ``<|image_pad|>`` for Qwen, ``<start_of_image>`` for Gemma 3, ...) stands for the next image,
    each video placeholder for the next video, in order. Without ``cache``, one is built with
    ``model_namespace(model, processor)`` (or ``namespace``); a passed cache is used as it is, so
    build it with that namespace. ``video_settings`` sets video sampling and resolution.

    Building it runs the load-time check on the model (once per model and namespace):
    ``ConfigurationError`` if the family description is not exact for it; ``exactness`` says
    whether misses are encoded together or one by one.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        processor: ProcessorMixin,
        cache: VisionEmbeddingCache | None = None,
        namespace: str | None = None,
        video_settings: VideoSettings | None = None,
    ) -> None:
        family = model_family(model)
        if cache is not None and namespace is not None:
            raise ConfigurationError(
                "pass namespace= to the VisionEmbeddingCache, not to CachedVisionModel, when passing a cache"
            )
        self.family = family.name
        self.model = model
        self.processor = processor
        derived = model_namespace(model, processor)
        self.cache = cache if cache is not None else VisionEmbeddingCache(namespace=namespace or derived)
        self.encoder = FamilyEncoder(family, model, processor)
        self.exactness: Exactness = check_exactness(self.encoder, derived)
        self.times = StageTimes()
        self.video_settings = video_settings or VideoSettings()
        self._video: VideoEncoder | None = None  # built on the first video (it checks the model)
        self._image_token: str = processor.image_token  # type: ignore[attr-defined]
        self._video_token: str | None = getattr(processor, "video_token", None)

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

    def image_outputs(self, images_per_request: Sequence[Sequence[ImageInput]]) -> list[list[dict[str, Any]]]:
        """Per request, each image's cached vision output (embeddings, placeholder expansion,
        forward inputs, deepstack features); the misses of all requests are preprocessed, then
        encoded in one call (one per variant), or one by one where batching is inexact."""
        sources: dict[ContentId, tuple[ImageInput, str | None]] = {}
        items_per_request = [self._items(list(images), sources) for images in images_per_request]
        return self.cache.encode_batch(items_per_request, lambda missing: self._encode(missing, sources))

    def video_outputs(self, videos_per_request: Sequence[Sequence[VideoInput]]) -> list[list[VideoOutput]]:
        """Per request, each video's output, cached per temporal patch; the missing patches of all
        requests are encoded in one call. The first call checks that the model's vision
        attention stays within a temporal patch (ConfigurationError if not)."""
        if self._video is None:
            family = self.encoder.family
            if family.video is None:
                raise ConfigurationError(
                    f"video is not cached for {family.name}: its vision tower is not known to attend "
                    "within a temporal patch; send frames as images, or use the model uncached"
                )
            self._video = VideoEncoder(
                self.model, self.processor, self.cache, self.video_settings, self.times, family
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
            checks = [(self._image_token, image_count, "images")]
            if self._video_token is not None:
                checks.append((self._video_token, video_count, "videos"))
            elif video_count:
                raise PlaceholderMismatchError(f"{video_count} videos were sent to a model without video")
            for token, count, kind in checks:
                placeholders = text.count(token)
                if placeholders != count:
                    raise PlaceholderMismatchError(
                        f"a prompt has {placeholders} {token} placeholders but {count} {kind} "
                        "were sent with it"
                    )

    def _items(
        self, images: list[ImageInput], sources: dict[ContentId, tuple[ImageInput, str | None]]
    ) -> list[Any]:
        """The cache items of one prompt's images: the images themselves, or, where the family
        preprocesses an image by its prompt (``Family.variant``), an id of image and variant."""
        variant = self.encoder.family.variant_of(len(images))
        if variant is None:
            return images
        items = []
        for image, digest in zip(images, self.cache.image_digests(images), strict=True):
            item = ContentId(f"visioncache.transformers.variant:{variant}:{digest.hex()}")
            sources[item] = (image, variant)
            items.append(item)
        return items

    @staticmethod
    def _source(item: Any, sources: dict[ContentId, tuple[ImageInput, str | None]]) -> tuple[Any, str | None]:
        return sources.get(item, (item, None)) if isinstance(item, ContentId) else (item, None)

    def _preprocess(self, items: list[Any], sources: dict[ContentId, Any]) -> list[PixelOnlyCacheEntry]:
        """The processor's image step on the items whose pixels missed, one image at a time (as
        the processor prepares each image of a batch)."""
        start = time.perf_counter()
        entries = []
        for item in items:
            image, variant = self._source(item, sources)
            entries.append(self.encoder.preprocess(load_pil_image(image), variant))
        elapsed = time.perf_counter() - start
        self.times.add(preprocess=elapsed, preprocessed=len(items))
        return [
            PixelOnlyCacheEntry(pixel_values=entry, processing_time=elapsed / len(items)) for entry in entries
        ]

    def _encode(self, items: list[Any], sources: dict[ContentId, Any]) -> list[dict[str, Any]]:
        """The vision tower on the items whose embeddings missed: one call per variant, or one
        per image where the load-time check found batching inexact."""
        pixels = self.cache.preprocess_images(items, lambda missing: self._preprocess(missing, sources))
        entries = [entry.pixel_values for entry in pixels]
        groups: dict[str | None, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(self._source(item, sources)[1], []).append(index)
        calls: list[tuple[str | None, list[int]]] = []
        for variant, group in groups.items():
            if self.exactness.batched:
                calls.append((variant, group))
            else:
                calls.extend((variant, [index]) for index in group)
        values: list[dict[str, Any] | None] = [None] * len(items)
        start = time.perf_counter()
        for variant, indexes in calls:
            encoded = self.encoder.encode([entries[index] for index in indexes], variant)
            for index, value in zip(indexes, encoded, strict=True):
                values[index] = value
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)  # time the tower's work, not just its launch
        self.times.add(encode=time.perf_counter() - start, encoded=len(items), encoder_calls=len(calls))
        return [value for value in values if value is not None]

    def _build_inputs(
        self,
        texts: list[str],
        values_per_request: Sequence[Sequence[dict[str, Any]]],
        videos_per_request: Sequence[Sequence[VideoOutput]],
    ) -> dict[str, Any]:
        """Tokenised texts (placeholders expanded from the cached values) plus the cached outputs."""
        values = [value for values in values_per_request for value in values]
        videos = [video for videos in videos_per_request for video in videos]
        replacements, extra = video_inputs(self.encoder, videos) if videos else ([], None)
        return self.encoder.model_inputs(texts, values, replacements, extra)
