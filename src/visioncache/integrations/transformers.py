"""Hugging Face transformers adapter: cached preprocessing and vision-encoder output for Qwen VLMs.

Why: the vision tower is the expensive part of a multimodal prefill and depends only on the image,
yet transformers recomputes it for every request. ``CachedVisionModel`` puts a
``VisionEmbeddingCache`` in front of Qwen2-VL, Qwen2.5-VL and Qwen3-VL: the image processor runs
only on images whose pixels are not cached, the vision tower only on images whose embeddings are
not cached (all of a batch's misses in one call), and the text is tokenised per request with each
image placeholder expanded from the image's grid, which the embedding entry carries, so an
embedding hit skips preprocessing too. The cached outputs reach the model through
``mm_encoder_outputs``, the path transformers itself uses after encoding, so a hit gives the same
logits as a miss. All caching logic stays in the core.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    import torch
    from transformers import PreTrainedModel, ProcessorMixin
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "visioncache.integrations.transformers needs torch and transformers: "
        f"pip install 'visioncache[hf]' ({error})"
    ) from error
from blake3 import blake3

from visioncache import PixelOnlyCacheEntry, VisionEmbeddingCache
from visioncache.errors import ConfigurationError, PlaceholderMismatchError
from visioncache.identity import frame
from visioncache.integrations.hf_images import ImageInput, load_pil_image

__all__ = [
    "DEEPSTACK_FAMILIES",
    "SUPPORTED_FAMILIES",
    "CachedVisionModel",
    "PlaceholderMismatchError",
    "StageTimes",
    "model_namespace",
]

SUPPORTED_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")  # config.model_type
# Families whose vision output also carries deepstack features, which the model must be fed back.
DEEPSTACK_FAMILIES = frozenset({"qwen3_vl"})
# Bump when the layout of a cached value changes, so old entries are never read as new ones.
VALUE_FORMAT = "visioncache.transformers/v1"

Request = tuple[str, Sequence[ImageInput]]


@dataclass
class StageTimes:
    """Work the adapter actually did (cache misses only): seconds and image counts per stage."""

    preprocess_seconds: float = 0.0
    encode_seconds: float = 0.0
    images_preprocessed: int = 0
    images_encoded: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(
        self, *, preprocess: float = 0.0, encode: float = 0.0, preprocessed: int = 0, encoded: int = 0
    ) -> None:
        # encode_fn may run on several engine threads at once (single-flight is per key).
        with self._lock:
            self.preprocess_seconds += preprocess
            self.encode_seconds += encode
            self.images_preprocessed += preprocessed
            self.images_encoded += encoded


def _family(model: PreTrainedModel) -> str:
    model_type = str(getattr(model.config, "model_type", None))
    if model_type not in SUPPORTED_FAMILIES or not hasattr(model, "get_image_features"):
        raise ConfigurationError(
            f"model family {model_type!r} is not supported by visioncache's transformers "
            f"integration; supported: {', '.join(SUPPORTED_FAMILIES)}"
        )
    return model_type


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    # A uint8 view handles every dtype, bf16 included, without a lossy conversion.
    return bytes(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())


def _weights_identity(model: PreTrainedModel) -> bytes:
    """Checkpoint name and commit where known, plus a digest of the vision tower's first and last
    parameter tensors: random or fine-tuned weights with the same config still differ."""
    config = model.config
    parameters = list(model.named_parameters())
    visual = [(name, p) for name, p in parameters if ".visual." in f".{name}"] or parameters
    hasher = blake3()
    for name, parameter in (visual[0], visual[-1]):
        hasher.update(frame(name.encode()) + frame(str(tuple(parameter.shape)).encode()))
        hasher.update(frame(_tensor_bytes(parameter)))
    origin = f"{getattr(config, '_name_or_path', '')}@{getattr(config, '_commit_hash', '')}"
    return frame(origin.encode()) + frame(hasher.digest())


def model_namespace(model: PreTrainedModel, processor: ProcessorMixin) -> str:
    """The cache namespace of ``model`` + ``processor``: differently configured, typed or weighted
    models or image processors never share it; equal ones always do (it is deterministic)."""
    family = _family(model)
    config = model.config
    token_ids = {
        name: getattr(config, name, None)
        for name in ("image_token_id", "vision_start_token_id", "vision_end_token_id")
    }
    parts = (
        VALUE_FORMAT,
        family,
        config.vision_config.to_json_string(use_diff=False),
        json.dumps(token_ids, sort_keys=True),
        processor.image_processor.to_json_string(),
        str(model.dtype),
    )
    hasher = blake3()
    for part in parts:
        hasher.update(frame(part.encode()))
    hasher.update(_weights_identity(model))
    return f"transformers:{family}:{hasher.hexdigest()}"


class CachedVisionModel:
    """Builds a Qwen VLM's model inputs with cached per-image pixels and vision-encoder output.

    ``prepare(text, images)`` / ``prepare_batch(requests)`` return keyword arguments for
    ``model(**inputs)`` and ``model.generate(**inputs)``; the logits equal those of
    ``model(**processor(images=..., text=...))``. Each ``<|image_pad|>`` in a text stands for the
    next image, in order. Without ``cache``, one is built with ``model_namespace(model, processor)``
    (or ``namespace``); a passed cache is used as it is, so build it with that namespace.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        processor: ProcessorMixin,
        cache: VisionEmbeddingCache | None = None,
        namespace: str | None = None,
    ) -> None:
        self.family = _family(model)
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
        self._image_token: str = processor.image_token  # type: ignore[attr-defined]

    def prepare(self, text: str, images: Sequence[ImageInput]) -> dict[str, Any]:
        """Model inputs for one request."""
        return self.prepare_batch([(text, images)])

    def prepare_batch(self, requests: Sequence[Request]) -> dict[str, Any]:
        """Model inputs for a padded batch of requests; their images' misses encode in one call."""
        texts = [text for text, _ in requests]
        self._check_placeholders(texts, [len(images) for _, images in requests])
        return self._build_inputs(texts, self.image_outputs([images for _, images in requests]))

    def image_outputs(
        self,
        images_per_request: Sequence[Sequence[ImageInput]],
    ) -> list[list[dict[str, Any]]]:
        """Per request, each image's cached vision output (embeddings, grid, deepstack features);
        the misses of all requests are preprocessed and encoded in one call each."""
        return self.cache.encode_batch([list(images) for images in images_per_request], self._encode)

    def model_inputs(
        self, texts: Sequence[str], values_per_request: Sequence[Sequence[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Model inputs from texts and the values ``image_outputs`` returned for them."""
        self._check_placeholders(texts, [len(values) for values in values_per_request])
        return self._build_inputs(list(texts), values_per_request)

    def _check_placeholders(self, texts: Sequence[str], image_counts: list[int]) -> None:
        for text, count in zip(texts, image_counts, strict=True):
            placeholders = text.count(self._image_token)
            if placeholders != count:
                raise PlaceholderMismatchError(
                    f"a prompt has {placeholders} {self._image_token} placeholders but {count} "
                    f"images were sent with it"
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
        self, texts: list[str], values_per_request: Sequence[Sequence[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Tokenised texts (placeholders expanded from the cached grids) plus the cached outputs."""
        processor: Any = self.processor
        values = [value for values in values_per_request for value in values]
        inputs: dict[str, Any] = {}
        if values:
            grids = torch.stack([value["image_grid_thw"] for value in values])
            replacements = [
                processor.replace_image_token({"image_grid_thw": grids}, image_idx=index)
                for index in range(len(values))
            ]
            texts, _ = processor.get_text_with_replacements(list(texts), replacements)
            inputs["image_grid_thw"] = grids
            inputs["mm_encoder_outputs"] = {"image": self._encoder_output(values)}
        tokens = processor.tokenizer(texts, padding=True, return_token_type_ids=False, return_tensors="pt")
        inputs.update(tokens)
        inputs["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(tokens["input_ids"]))
        device = self.model.device
        return {
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in inputs.items()
        }

    def _encoder_output(self, values: list[dict[str, Any]]) -> BaseModelOutputWithPooling:
        embeddings = tuple(value["embeddings"] for value in values)
        # Qwen models take one tensor per image here, though transformers annotates one tensor.
        if self.family not in DEEPSTACK_FAMILIES:
            return BaseModelOutputWithPooling(pooler_output=embeddings)  # type: ignore[arg-type]
        layers = len(values[0]["deepstack_features"])
        deepstack = [tuple(value["deepstack_features"][layer] for value in values) for layer in range(layers)]
        return BaseModelOutputWithDeepstackFeatures(pooler_output=embeddings, deepstack_features=deepstack)  # type: ignore[arg-type]
