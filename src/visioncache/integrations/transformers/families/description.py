"""A model family's description: the facts a per-image cache must get right, stated once per family.

Why data, not branches: transformers' multimodal processors share one seam (``ProcessorMixin``):
the image processor runs on the images, ``replace_image_token`` writes each image's placeholder
expansion, ``get_text_with_replacements`` puts the expansions into the text, and the model takes
the vision tower's output back through ``mm_encoder_outputs``. Families differ only in a handful
of facts around that seam: which processor outputs belong to one image, how several images join
in one vision-tower call, what the tower returns besides one tensor per image, and what the
forward still needs. A `Family` states those facts; `FamilyEncoder` (``encoding.py``) applies
them, the same way for every family; ``docs/families.md`` describes the concept.

Whatever a description says is checked on the loaded model before it is used
(``exactness.py``): a wrong description is refused, never trusted by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from transformers.modeling_outputs import BaseModelOutputWithPooling

__all__ = [
    "Family",
    "Preprocessor",
    "Splitter",
    "VideoDescription",
    "grid_family",
    "process_images",
    "split_rows",
]

# (processor, images, variant, images_kwargs) -> (the image processor's outputs, one expansion per image)
Preprocessor = Callable[[Any, list[Any], "str | None", dict[str, Any]], tuple[Mapping[str, Any], list[str]]]
# (the tower's pooled output or one deepstack layer, rows per image) -> one tensor per image
Splitter = Callable[[Any, list[int]], list[Any]]


def process_images(
    processor: Any, images: list[Any], variant: str | None, images_kwargs: dict[str, Any]
) -> tuple[Mapping[str, Any], list[str]]:
    """The processor's own image step (image processor, then ``replace_image_token`` per image),
    as ``processor(text=..., images=...)`` runs it."""
    outputs, replacements = processor._process_images(images, **images_kwargs)
    return outputs, list(replacements)


def split_rows(pooled: Any, counts: list[int]) -> list[Any]:
    """Per image, its rows of the tower's output, in order: the output is one tensor per image
    or per batch of any leading shape, and each image owns as many rows as image tokens (the
    forward scatters the rows into the image tokens in order). Cloned, so a cached image does not
    keep its batch's storage alive."""
    import torch

    parts = list(pooled) if isinstance(pooled, list | tuple) else [pooled]
    rows = torch.cat([part.reshape(-1, part.shape[-1]) for part in parts])
    if rows.shape[0] != sum(counts):
        return [rows]  # the caller reports the mismatch with the counts
    return [part.clone() for part in torch.split(rows, counts)]


@dataclass(frozen=True)
class VideoDescription:
    """How a family's video prompt and inputs are written, where its tower is per temporal patch."""

    timestamps_in_prompt: bool = False  # Qwen3-VL writes "<t seconds>" before each patch
    seconds_per_grid_input: bool = False  # Qwen2.5-VL's forward takes second_per_grid_ts


@dataclass(frozen=True)
class Family:
    """The facts of one model family (``config.model_type``) that caching per image depends on.

    Attributes:
        name: ``config.model_type``.
        encoder_inputs: per-image processor outputs that ``get_image_features`` takes, by keyword.
        forward_inputs: per-image processor outputs the forward still needs next to
            ``mm_encoder_outputs`` (M-RoPE grids); cached with the embedding.
        batch_dim: the axis on which several images' inputs join for one tower call (Idefics3
            puts a prompt's tiles on axis 1).
        pad_values: the padding value of an input whose per-image shapes differ (pixel tensors
            padded to the largest image, as the image processors pad a batch); 0 if not named.
        pooled_as: how ``mm_encoder_outputs["image"].pooler_output`` is given back: one tensor
            per image (``"tuple"``) or their rows concatenated (``"tensor"``).
        output_class: the encoder output type the forward reads (Qwen3-VL: with deepstack).
        deepstack: the tower also returns per-layer features, split and cached like the embeddings.
        text_renames: names the processor gives its text outputs (Gemma 3's ``token_type_ids``).
        encoder_kwargs: extra keywords of one tower call, from its images' variant and number.
        variant: the variant of an image that came in a group of n images (an inner list of
            the processor's ``images=`` after its layout; 1 for an image of a flat list), where a
            family preprocesses an image differently by context (LLaVA-OneVision: anyres alone,
            base size in a group of several); cached apart. None: one variant.
        preprocess: the image step, default the processor's own (`process_images`).
        split: how a tower call's output splits back per image (`split_rows`).
        video: set where the tower attends within a temporal patch (video cached per patch).
        probe_sizes: (height, width) of the load-time check's probe images: different token
            counts, small enough to be cheap.
    """

    name: str
    encoder_inputs: tuple[str, ...] = ("pixel_values",)
    forward_inputs: tuple[str, ...] = ()
    batch_dim: int = 0
    pad_values: Mapping[str, float] = field(default_factory=dict)
    pooled_as: str = "tuple"
    output_class: type[BaseModelOutputWithPooling] = BaseModelOutputWithPooling
    deepstack: bool = False
    text_renames: Mapping[str, str] = field(default_factory=dict)
    encoder_kwargs: Callable[[str | None, int], dict[str, Any]] | None = None
    variant: Callable[[int], str | None] | None = None
    preprocess: Preprocessor = process_images
    split: Splitter = split_rows
    video: VideoDescription | None = None
    probe_sizes: tuple[tuple[int, int], tuple[int, int]] = ((56, 84), (84, 112))

    def __post_init__(self) -> None:
        if self.pooled_as not in ("tuple", "tensor"):
            raise ValueError(f"pooled_as must be 'tuple' or 'tensor', got {self.pooled_as!r}")

    def variant_of(self, images_in_group: int) -> str | None:
        """The variant of each image of a group (``call_forms.Placed.group``) of that many images."""
        return self.variant(images_in_group) if self.variant is not None else None


def grid_family(name: str, **facts: Any) -> Family:
    """A family whose images are patch rows plus an ``image_grid_thw`` row, which the forward
    needs too (M-RoPE): Qwen2-VL's layout, shared by its successors and GLM-4V."""
    inputs = ("pixel_values", "image_grid_thw")
    return Family(name, encoder_inputs=inputs, forward_inputs=("image_grid_thw",), **facts)
