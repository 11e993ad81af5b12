"""The few attributes of mlx-vlm objects the mlx integration touches, as small Protocols.

mlx ships no type stubs, so an ``mlx.core.array`` is ``Array`` (``Any``) here; everything else
the integration reads from a model, its configuration or a processor is named below, so mypy
checks each use and a reader sees what the integration relies on.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeAlias

__all__ = [
    "Array",
    "EmbeddingsOutput",
    "ImageProcessor",
    "LanguageModel",
    "Model",
    "ModelConfig",
    "Processor",
    "Tokenizer",
]

Array: TypeAlias = Any  # mlx.core.array


class ModelConfig(Protocol):
    """An mlx-vlm ``ModelConfig`` (a dataclass): its ``model_type`` and family-specific fields."""

    model_type: str


class EmbeddingsOutput(Protocol):
    """mlx-vlm's ``InputEmbeddingsFeatures``: what ``get_input_embeddings`` returns."""

    inputs_embeds: Array

    def to_dict(self) -> dict[str, Any]: ...


class LanguageModel(Protocol):
    """The language model inside an mlx-vlm model (``model.language_model``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class Model(Protocol):
    """An mlx-vlm vision-language model (``mlx_vlm.load(...)[0]``)."""

    @property
    def config(self) -> ModelConfig: ...

    @property
    def language_model(self) -> LanguageModel: ...

    def get_input_embeddings(
        self, input_ids: Array = None, pixel_values: Array = None, **kwargs: Any
    ) -> EmbeddingsOutput: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class Tokenizer(Protocol):
    """A Hugging Face tokenizer."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def convert_tokens_to_ids(self, tokens: str) -> int: ...


class ImageProcessor(Protocol):
    """An image processor: its settings are its instance attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class Processor(Protocol):
    """An mlx-vlm processor (``mlx_vlm.load(...)[1]``): an image processor and a tokenizer."""

    @property
    def image_processor(self) -> ImageProcessor: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
