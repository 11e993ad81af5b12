"""What the transformers adapter knows of a model: its family, its cache namespace, its work done.

Why a module of its own: the image path (``adapter.py``) and the video path (``video.py``) both
need the family and count their work in one ``StageTimes``; the namespace is derived once, by the
project's one fingerprint helper, from everything that shapes a cached value.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, ProcessorMixin

from visioncache import forking
from visioncache.integrations.fingerprint import fingerprint, stable_json
from visioncache.integrations.transformers.families import FAMILIES, Family, family_for

__all__ = [
    "DEEPSTACK_FAMILIES",
    "SUPPORTED_FAMILIES",
    "VALUE_FORMAT",
    "StageTimes",
    "model_family",
    "model_namespace",
]

SUPPORTED_FAMILIES = tuple(FAMILIES)  # config.model_type
# Families whose vision output also carries deepstack features, which the model must be fed back.
DEEPSTACK_FAMILIES = frozenset(name for name, family in FAMILIES.items() if family.deepstack)
# Bump when the layout of a cached value changes, so old entries are never read as new ones.
VALUE_FORMAT = "visioncache.transformers/v3"
# Where families keep the vision path's parameters (tower, projector, newline embedding).
_VISION_MODULES = (
    "visual",
    "vision_tower",
    "vision_model",
    "multi_modal_projector",
    "connector",
    "embed_vision",
)


@dataclass
class StageTimes:
    """Work the adapter actually did (cache misses only): seconds, and what each stage processed."""

    preprocess_seconds: float = 0.0
    encode_seconds: float = 0.0
    images_preprocessed: int = 0
    images_encoded: int = 0
    frames_preprocessed: int = 0  # video frames resized and normalised
    patches_encoded: int = 0  # video temporal patches through the vision tower
    encoder_calls: int = 0  # vision-tower calls for images (one per batch of misses, or per image)
    _lock: threading.Lock = field(default_factory=forking.lock, repr=False, compare=False)

    def add(
        self,
        *,
        preprocess: float = 0.0,
        encode: float = 0.0,
        preprocessed: int = 0,
        encoded: int = 0,
        frames_preprocessed: int = 0,
        patches_encoded: int = 0,
        encoder_calls: int = 0,
    ) -> None:
        # encode_fn may run on several engine threads at once (single-flight is per key).
        with self._lock:
            self.preprocess_seconds += preprocess
            self.encode_seconds += encode
            self.images_preprocessed += preprocessed
            self.images_encoded += encoded
            self.frames_preprocessed += frames_preprocessed
            self.patches_encoded += patches_encoded
            self.encoder_calls += encoder_calls


def model_family(model: PreTrainedModel) -> Family:
    """The description of a supported model's family; ConfigurationError for any other."""
    return family_for(model)


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    # A uint8 view handles every dtype, bf16 included, without a lossy conversion.
    return bytes(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())


def _weights_identity(model: PreTrainedModel) -> list[str | bytes]:
    """Checkpoint name and commit where known, plus the vision tower's first and last parameter
    tensors: random or fine-tuned weights with the same config still differ."""
    config = model.config
    parameters = list(model.named_parameters())
    visual = [
        (name, p) for name, p in parameters if any(f".{module}." in f".{name}" for module in _VISION_MODULES)
    ] or parameters
    parts: list[str | bytes] = [
        f"{getattr(config, '_name_or_path', '')}@{getattr(config, '_commit_hash', '')}"
    ]
    for name, parameter in (visual[0], visual[-1]):
        parts += [name, str(tuple(parameter.shape)), _tensor_bytes(parameter)]
    return parts


def model_namespace(model: PreTrainedModel, processor: ProcessorMixin) -> str:
    """The cache namespace of ``model`` + ``processor``: differently configured, typed or weighted
    models or image processors never share it; equal ones always do (it is deterministic)."""
    family = model_family(model).name
    config = model.config.to_dict()
    config.pop("text_config", None)  # the language model shapes no cached value
    token_ids = {
        name: getattr(model.config, name, None)
        for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    }
    # The processor's own settings shape each image's placeholder expansion (tokens per image,
    # tiles, aspect-ratio modes); its tokenizer does not: expansions are cached as text.
    settings = {
        name: value
        for name, value in vars(processor).items()
        if isinstance(value, str | int | float | bool | type(None)) and name != "chat_template"
    }
    parts: list[str | bytes] = [
        VALUE_FORMAT,
        family,
        stable_json(config),
        stable_json(token_ids),
        stable_json(settings),
        processor.image_processor.to_json_string(),
        str(model.dtype),
        *_weights_identity(model),
    ]
    return f"transformers:{family}:{fingerprint(parts)}"
