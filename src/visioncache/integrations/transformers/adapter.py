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
from typing import Any, TypeAlias

import torch
from transformers import PreTrainedModel, ProcessorMixin

from visioncache import ContentId, PixelOnlyCacheEntry, VisionEmbeddingCache
from visioncache.errors import ConfigurationError, PlaceholderMismatchError, UnsupportedInputTypeError
from visioncache.integrations.transformers.call_forms import Placed, images_of, lay_out
from visioncache.integrations.transformers.encoding import FamilyEncoder
from visioncache.integrations.transformers.exactness import Exactness, check_exactness
from visioncache.integrations.transformers.images import ImageInput, load_pil_image
from visioncache.integrations.transformers.model import StageTimes, model_family, model_namespace
from visioncache.integrations.transformers.video import VideoEncoder, VideoOutput, video_inputs
from visioncache.integrations.video import VideoInput, VideoSettings

__all__ = ["CachedVisionModel"]

# An ``images=`` argument as the processor takes it: a bare image, a flat list, a list per prompt.
Images: TypeAlias = "ImageInput | Sequence[ImageInput] | Sequence[Sequence[ImageInput]] | None"
# (text, images) or (text, images, videos); each placeholder in the text stands for the next one.
Request = tuple[str, Images] | tuple[str, Images, Sequence[VideoInput]]


class CachedVisionModel:
    """Builds a VLM's model inputs with cached per-image (and per-temporal-patch) vision output.

    ``prepare(text, images, videos)`` / ``prepare_batch(requests)`` return keyword arguments for
    ``model(**inputs)`` and ``model.generate(**inputs)``; the logits equal those of the model on
    the same pixels uncached, for the processor's own call forms (``call_forms.py``: a bare
    image, a flat list, a list per prompt, a batch of prompts, each taken as the processor takes
    it). Each of the processor's image placeholders (``processor.image_token``:
    ``<|image_pad|>`` for Qwen, ``<start_of_image>`` for Gemma 3, ...) stands for the next image,
    each video placeholder for the next video, in order. Without ``cache``, one is built with
    ``model_namespace(model, processor)`` (or ``namespace``); a passed cache is used as it is, so
    build it with that namespace. ``video_settings`` sets video sampling and resolution.
    ``tower_graphs``: on a CUDA device, how many CUDA graphs of the vision tower to keep for the
    patch grids a video's missing patches repeat (``tower_graphs.py``; proven equal to the eager
    call on first replay, else refused); 0 turns them off.

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
        tower_graphs: int = 4,
    ) -> None:
        if type(tower_graphs) is not int or tower_graphs < 0:
            raise ConfigurationError(
                f"tower_graphs must be an int >= 0 (0 turns them off), got {tower_graphs!r}"
            )
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
        self.tower_graphs = tower_graphs
        self._video: VideoEncoder | None = None  # built on the first video (it checks the model)
        self._image_token: str = processor.image_token  # type: ignore[attr-defined]
        self._video_token: str | None = getattr(processor, "video_token", None)

    def prepare(
        self, text: str | Sequence[str], images: Images = (), videos: Sequence[VideoInput] = ()
    ) -> dict[str, Any]:
        """Model inputs for ``processor(text=text, images=images, videos=videos)``'s arguments,
        taken as the processor takes them (``call_forms.py``): ``text`` one prompt or a batch;
        ``images`` a bare image, a flat list (each image fills the next placeholder across the
        batch) or one list per prompt (LLaVA-OneVision: a flat list's images are each prepared
        as alone, an inner list's as one multi-image group). A form the processor refuses is
        refused (``PlaceholderMismatchError``, ``InvalidArgumentError``)."""
        texts = self._texts([text] if isinstance(text, str) else text)
        placed = lay_out(self.processor, texts, images, self._ignored())
        if isinstance(text, str):
            videos_per_request = [list(videos)]
        else:
            videos_per_request = self._videos_per_prompt(texts, list(videos))
        return self._prepare(texts, placed, videos_per_request)

    def prepare_batch(self, requests: Sequence[Request]) -> dict[str, Any]:
        """Model inputs for a padded batch of requests, each request's images taken as
        ``processor(text=[text], images=images)`` takes them; the misses encode in one call per
        kind."""
        texts = self._texts([request[0] for request in requests])
        ignored = self._ignored()
        placed = [
            lay_out(self.processor, [text], request[1], ignored)[0]
            for text, request in zip(texts, requests, strict=True)
        ]
        videos = [list(request[2]) if len(request) > 2 else [] for request in requests]
        return self._prepare(texts, placed, videos)

    def image_outputs(self, images_per_request: Sequence[Images]) -> list[list[dict[str, Any]]]:
        """Per request, each image's cached vision output (embeddings, placeholder expansion,
        forward inputs, deepstack features), each request's images taken as the processor takes
        them for one prompt; the misses of all requests are preprocessed, then encoded in one
        call (one per variant), or one by one where batching is inexact."""
        placed = []
        for images in images_per_request:
            text = self._image_token * len(images_of(images))
            placed.append(lay_out(self.processor, [text], images)[0])
        return self._image_values(placed)

    def _texts(self, texts: Sequence[Any]) -> list[str]:
        if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
            raise UnsupportedInputTypeError("a prompt must be a str (or a list of str for a batch)")
        return list(texts)

    def _videos_per_prompt(self, texts: list[str], videos: list[VideoInput]) -> list[list[VideoInput]]:
        """A batch's videos, each filling the next video placeholder across the batch."""
        counts = [text.count(self._video_token) if self._video_token else 0 for text in texts]
        if sum(counts) != len(videos):
            raise PlaceholderMismatchError(
                f"the prompts have {sum(counts)} video placeholders but {len(videos)} videos were sent"
            )
        starts = [sum(counts[:index]) for index in range(len(texts))]
        return [videos[start : start + count] for start, count in zip(starts, counts, strict=True)]

    def _ignored(self) -> tuple[str, ...]:
        return (self._video_token,) if self._video_token else ()

    def _prepare(
        self, texts: list[str], placed: list[list[Placed]], videos: list[list[VideoInput]]
    ) -> dict[str, Any]:
        self._check_placeholders(texts, [len(p) for p in placed], [len(v) for v in videos])
        video_values = self.video_outputs(videos) if any(videos) else [[] for _ in texts]
        return self._build_inputs(texts, self._image_values(placed), video_values)

    def _image_values(self, placed_per_request: list[list[Placed]]) -> list[list[dict[str, Any]]]:
        sources: dict[ContentId, tuple[ImageInput, str | None]] = {}
        items_per_request = [self._items(placed, sources) for placed in placed_per_request]
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
                self.model,
                self.processor,
                self.cache,
                self.video_settings,
                self.times,
                family,
                self.tower_graphs,
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
        self, placed: list[Placed], sources: dict[ContentId, tuple[ImageInput, str | None]]
    ) -> list[Any]:
        """The cache items of one prompt's images: the images themselves, or, where the family
        prepares an image by the group it came in (``Family.variant``), an id of image and variant."""
        variants = [self.encoder.family.variant_of(image.group) for image in placed]
        images = [image.image for image in placed]
        if all(variant is None for variant in variants):
            return images
        items = []
        for image, variant, digest in zip(images, variants, self.cache.image_digests(images), strict=True):
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
