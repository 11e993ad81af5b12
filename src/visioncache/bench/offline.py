"""The pieces every offline family model is built from besides its tokenizer
(``bench/vocabulary.py``): a processor without its video processor, and weights that all matter.

Why: no processor file or weight can be downloaded here, and most stock video processors need
torchvision, which has no CPU build here. Random weights prove exactness as well as trained
ones, as long as no parameter is a constant that hides an input (Gemma 3 initialises its
projection to zeros).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast, ProcessorMixin

from visioncache.bench.family_models.checkpoints import CHECKPOINTS
from visioncache.bench.towers import VISION_TOWERS
from visioncache.errors import ConfigurationError

__all__ = [
    "image_only_processor",
    "import_without_torchvision",
    "random_model",
    "randomize_constant_parameters",
    "token_id",
    "tower",
]


def tower(family: str, vision: str) -> dict[str, Any]:
    """``family``'s vision-tower configuration of size ``vision``: its widths and depths
    (``bench/towers.py``) with the image geometry of the family's published checkpoint
    (``family_models/checkpoints.py``), a copy; ConfigurationError where it has none of that size."""
    sizes = VISION_TOWERS.get(family, {})
    if vision not in sizes:
        raise ConfigurationError(
            f"--vision {vision} is not defined for {family}; its towers: {', '.join(sizes) or 'none'}"
        )
    checkpoint = CHECKPOINTS.get(family)
    return {**sizes[vision], **(checkpoint.vision if checkpoint is not None else {})}


def token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    """The id of one token."""
    return int(tokenizer.convert_tokens_to_ids(token))  # type: ignore[arg-type]


def image_only_processor(processor_class: type[ProcessorMixin], **parts: Any) -> ProcessorMixin:
    """``processor_class`` built without its video processor (stock ones need torchvision).

    transformers takes a processor's sub-processors from its ``__init__`` signature, so the
    subclass's signature drops ``video_processor``; a class in the MRO between the family's and
    ``ProcessorMixin`` drops the ``video_processor=None`` the family's ``__init__`` passes on.
    """
    family_init: Any = processor_class.__init__
    signature = inspect.signature(family_init)
    takes_video = "video_processor" in signature.parameters

    class _WithoutVideo(ProcessorMixin):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("video_processor", None)
            mixin_init: Any = super().__init__
            mixin_init(*args, **kwargs)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if takes_video:
            kwargs.setdefault("video_processor", None)
        family_init(self, *args, **kwargs)

    __init__.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p for name, p in signature.parameters.items() if name != "video_processor"]
    )
    image_only = type(
        f"ImageOnly{processor_class.__name__}", (processor_class, _WithoutVideo), {"__init__": __init__}
    )
    processor: ProcessorMixin = image_only(**parts)
    return processor


def import_without_torchvision(module: str) -> Any:
    """Import a processing module whose top level imports a torchvision image processor only
    for a helper the processor does not call on images (``PixtralProcessor``): vision is
    reported unavailable while it imports."""
    import transformers.image_utils
    import transformers.processing_utils
    import transformers.video_utils  # noqa: F401 (import before vision is reported absent)

    utils: Any = importlib.import_module("transformers.utils")

    available = utils.is_vision_available
    utils.is_vision_available = lambda: False
    try:
        return importlib.import_module(module)
    finally:
        utils.is_vision_available = available


def randomize_constant_parameters(model: PreTrainedModel, seed: int = 0) -> PreTrainedModel:
    """Add small noise to every parameter whose values are all equal (zeros, ones), so that no
    input can be hidden by a zero projection or a constant bias."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            flat = parameter.flatten()
            if flat.numel() and bool((flat == flat[0]).all()):
                noise = torch.randn(parameter.shape, generator=generator) * 0.02
                parameter.add_(noise.to(parameter.dtype))
    return model


def random_model(model_class: Any, config: Any, dtype: torch.dtype, seed: int) -> PreTrainedModel:
    """``model_class(config)`` with seeded random weights, none constant, in eval mode."""
    torch.manual_seed(seed)
    model: Any = randomize_constant_parameters(model_class(config), seed)
    built: PreTrainedModel = model.to(dtype).eval()
    return built
