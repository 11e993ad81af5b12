"""What a model family is to visioncache on mlx-vlm, stated once per family.

Families differ in four facts, and a `Family` states each for its models (the same concept as
the transformers integration's family descriptions; see docs/mlx-vlm.md):

1. **One image, preprocessed** (`preprocess`): the image processor's output for that image alone
   (a `PixelOnlyCacheEntry`) and its *layout* (what the placeholder expansion needs: a grid,
   tile rows and columns, a soft-token count).
2. **Its placeholder, expanded** (`image_text`): the text one image placeholder becomes, from the
   layout alone; the layout is cached with the features, so a hit needs no preprocessing.
3. **Misses batched and split** (`encode`): one vision-tower call over many images, split into
   one value per image (its features, its layout, and whatever else the language model reads,
   e.g. Qwen3-VL's deepstack features).
4. **What the model is fed** (`feed`, `forward`, `window`): the language model's inputs built
   from cached values as the model's own uncached forward builds them; `window` gives the
   inputs of a span of positions (a KV prefix hit prefills only its tail).

`selfcheck.check_family` proves 3 and 4 on the loaded model (alone vs batched vs the model's own
uncached path) before anything is served.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from visioncache import PixelOnlyCacheEntry, PlaceholderMismatchError
from visioncache.integrations.mlx_vlm.imports import import_mlx, import_mlx_vlm_utils
from visioncache.integrations.mlx_vlm.protocols import Array, Model, Processor

__all__ = ["Family", "Feed", "ImageValue", "split_rows"]

# A cached per-image value: arrays (mlx) and plain scalars, by name; always holds
# "image_features" (one row per image token) and the family's layout fields.
ImageValue = dict[str, Any]


@dataclass
class Feed:
    """What the language model is fed for a batch of prompts, built from cached values.

    ``inputs`` are the keyword arguments of ``model.language_model(input_ids, **inputs)`` for
    the whole prompt, ``inputs_embeds`` among them.
    """

    input_ids: Array
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def inputs_embeds(self) -> Array:
        return self.inputs["inputs_embeds"]


def split_rows(features: Array, counts: Sequence[int]) -> list[Array]:
    """``features`` split along its first axis into parts of ``counts`` rows, each its own copy
    (so an entry holds, and is charged for, its own rows only, and evicting it frees them),
    evaluated now: `Family.encode` returns evaluated values."""
    mx = import_mlx()
    if len(counts) == 1:
        return [features]
    boundaries = [sum(counts[: index + 1]) for index in range(len(counts) - 1)]
    parts = [mx.array(part) for part in mx.split(features, boundaries)]
    mx.eval(parts)
    return parts


class Family(ABC):
    """One model family's facts; subclasses state them (see the module docstring)."""

    name: ClassVar[str]  # the family, as docs and errors name it
    model_types: ClassVar[frozenset[str]]  # mlx-vlm model types (config.json's model_type)
    processor_classes: ClassVar[frozenset[str]]  # mlx-vlm processor class names
    # A value's fields that fix its layout (its token count and positions). Set where `window`
    # reads an image's value for that image's own positions only, so a prompt whose reused KV
    # covers an image may be fed a stand-in of that layout with zero features (vllm_mlx.covered).
    layout_fields: ClassVar[frozenset[str]] = frozenset()
    positions: ClassVar[str]  # its position scheme, e.g. "M-RoPE" or "1-D RoPE"

    # ---- 1. one image ------------------------------------------------------------------------
    @abstractmethod
    def preprocess(self, processor: Processor, images: Sequence[Any]) -> list[PixelOnlyCacheEntry]:
        """One image-processor call over ``images``.

        Args:
            processor: the model's mlx-vlm processor.
            images: the images, as mlx-vlm's ``load_image`` reads them.

        Returns:
            One `PixelOnlyCacheEntry` per image, in order, its arrays mlx.
        """

    def pixel_layout(self, entry: PixelOnlyCacheEntry) -> Mapping[str, Any]:
        """The layout of a preprocessed image (what `image_text` needs).

        Args:
            entry: the image's preprocessed entry.

        Returns:
            Default: its ``image_grid_thw`` (the patch grid, Qwen's and Gemma 4's layout), or
            nothing for a family whose every image has one layout.
        """
        return {} if entry.image_grid_thw is None else {"image_grid_thw": entry.image_grid_thw}

    @abstractmethod
    def pixel_inputs(
        self, entries: Sequence[PixelOnlyCacheEntry], images_per_prompt: Sequence[int]
    ) -> dict[str, Any]:
        """mlx-vlm's pixel inputs for these images in prompt order.

        Args:
            entries: the images' entries, in placeholder order over the batch.
            images_per_prompt: how many images each prompt of the batch holds.

        Returns:
            The keyword arguments mlx-vlm's model takes for them (``pixel_values``, ...).
        """

    # ---- 2. its placeholder -------------------------------------------------------------------
    @abstractmethod
    def image_text(self, processor: Processor, layout: Mapping[str, Any]) -> str:
        """The text one image placeholder expands to.

        Args:
            processor: the model's mlx-vlm processor.
            layout: the image's `pixel_layout`.

        Returns:
            The placeholder's expansion, as the processor writes it for this image.
        """

    def placeholder(self, processor: Processor) -> str:
        """The image placeholder a prompt holds before expansion."""
        token: str = getattr(processor, "image_token")  # noqa: B009 - every supported processor has one
        return token

    def marker(self, processor: Processor) -> str:
        """What a chat template writes for one image: the placeholder and any tokens around it."""
        return self.placeholder(processor)

    def check_prompt(self, processor: Processor, prompt: str, images: int) -> None:
        """PlaceholderMismatchError where the family cannot serve ``prompt`` with ``images``
        images (checked before anything is encoded): by default, one placeholder per image."""
        token = self.placeholder(processor)
        if prompt.count(token) != images:
            raise PlaceholderMismatchError(
                f"the prompt holds {prompt.count(token)} image placeholder(s) {token!r} "
                f"but {images} image(s) were given"
            )

    def probe_prompt(self, marker: str) -> str:
        """The self-check's prompt around ``marker`` (one image each): two images by default."""
        return f"describe {marker} and {marker} please"

    def check_prompts(self, processor: Processor, prompts: Sequence[str], images: int) -> None:
        """`check_prompt` for a batch of prompts taking ``images`` images in all, in order."""
        token = self.placeholder(processor)
        for prompt in prompts:
            self.check_prompt(processor, prompt, prompt.count(token))
        found = sum(prompt.count(token) for prompt in prompts)
        if found != images:
            raise PlaceholderMismatchError(
                f"the prompts hold {found} image placeholder(s) {token!r} but {images} image(s) were given"
            )

    def expand_prompts(
        self, processor: Processor, prompts: Sequence[str], layouts: Sequence[Mapping[str, Any]]
    ) -> list[str]:
        """Replace the n-th placeholder (over all prompts, in order) by the n-th image's text."""
        token = self.placeholder(processor)
        self.check_prompts(processor, prompts, len(layouts))
        texts = iter([self.image_text(processor, layout) for layout in layouts])
        expanded = []
        for prompt in prompts:
            pieces = prompt.split(token)
            expanded.append(pieces[0] + "".join(next(texts) + piece for piece in pieces[1:]))
        return expanded

    def tokenize(
        self,
        processor: Processor,
        prompts: Sequence[str],
        layouts: Sequence[Mapping[str, Any]],
        *,
        add_special_tokens: bool = False,
    ) -> dict[str, Any]:
        """``input_ids`` and ``attention_mask`` (mlx) of the expanded prompts, tokenised through
        the call mlx-vlm's ``prepare_inputs`` makes (its padding), minus the images."""
        utils = import_mlx_vlm_utils()
        mx = import_mlx()
        outputs = utils.process_inputs_with_fallback(
            processor,
            prompts=self.expand_prompts(processor, prompts, layouts),
            images=None,
            audio=None,
            add_special_tokens=add_special_tokens,
        )
        return {
            name: value if isinstance(value, mx.array) else mx.array(value) for name, value in outputs.items()
        }

    # ---- 3. misses, batched -------------------------------------------------------------------
    @abstractmethod
    def tower(self, model: Model) -> Any:
        """The vision tower module (its class is what tests count calls on).

        Args:
            model: the loaded mlx-vlm model.
        """

    @abstractmethod
    def encode(self, model: Model, entries: Sequence[PixelOnlyCacheEntry]) -> list[ImageValue]:
        """ONE tower call over all entries.

        Args:
            model: the loaded mlx-vlm model.
            entries: the missing images' entries.

        Returns:
            One value per image, in order, evaluated (`split_rows` gives each its own rows).
        """

    @abstractmethod
    def token_count(self, model: Model, layout: Mapping[str, Any]) -> int:
        """How many image tokens (feature rows) an image of this layout has.

        Args:
            model: the loaded mlx-vlm model.
            layout: the image's `pixel_layout` (or its cached value, which carries it).
        """

    def image_token_id(self, model: Model) -> int:
        """The id of the image placeholder token in this model's prompts."""
        config = model.config
        token_id: int | None = getattr(config, "image_token_id", None)
        if token_id is None:
            token_id = getattr(config, "image_token_index")  # noqa: B009
        return int(token_id)

    def hidden_size(self, model: Model) -> int:
        """The width of a feature row (the language model's hidden size)."""
        return int(getattr(model.config, "text_config").hidden_size)  # noqa: B009

    def fits(self, model: Model) -> Callable[[Any], bool]:
        """A check of a cached value on a hit: one row per image token, this model's width."""
        hidden = self.hidden_size(model)

        def check(value: Any) -> bool:
            if not isinstance(value, Mapping) or "image_features" not in value:
                return False
            shape = tuple(value["image_features"].shape)
            return shape == (self.token_count(model, value), hidden) and self.fits_extras(model, value)

        return check

    def fits_extras(self, model: Model, value: Mapping[str, Any]) -> bool:
        """A family's check of the value's other arrays (none by default)."""
        return True

    # ---- 4. what the model is fed -------------------------------------------------------------
    def uncached_inputs(self, processor: Processor, images: Sequence[Any], prompt: str) -> dict[str, Any]:
        """mlx-vlm's own inputs for one prompt without the cache (``mlx_vlm.utils.prepare_inputs``),
        what the self-check's reference forward takes."""
        utils = import_mlx_vlm_utils()
        return dict(utils.prepare_inputs(processor, images=list(images), prompts=[prompt]))

    def uncached_forward(self, model: Model, inputs: Mapping[str, Any]) -> Any:
        """The model's own forward on ``mlx_vlm.utils.prepare_inputs`` output, as mlx-vlm's
        ``generate`` and vllm-mlx run it (what the self-check compares `forward` with)."""
        inputs = dict(inputs)
        input_ids, pixel_values, mask = (
            inputs.pop(name) for name in ("input_ids", "pixel_values", "attention_mask")
        )
        return model(input_ids, pixel_values, mask=mask, **inputs)

    def tower_dtype(self, model: Model) -> Any:
        """The dtype the tower computes in (its first parameter's; cached features depend on it)."""
        from mlx.utils import tree_flatten

        parameters: Any = tree_flatten(self.tower(model).parameters())
        if not parameters:
            raise ValueError("the vision tower has no parameters")
        return parameters[0][1].dtype

    @abstractmethod
    def hook_inputs(self, model: Model, values: Sequence[ImageValue]) -> dict[str, Any]:
        """What replaces the tower for these images.

        Args:
            model: the loaded mlx-vlm model.
            values: the prompt's images' cached values, in placeholder order.

        Returns:
            Keyword arguments for ``model(...)`` / mlx-vlm's ``generate_step`` (mlx-vlm's
            ``cached_image_features``, plus what it drops).
        """

    @abstractmethod
    def feed(self, model: Model, input_ids: Array, hook: Mapping[str, Any]) -> Feed:
        """The language model's inputs for the whole prompt, as the model's forward builds them.

        Args:
            model: the loaded mlx-vlm model.
            input_ids: the prompt's token ids, batch first.
            hook: `hook_inputs`' output.

        Returns:
            A `Feed` (the attention mask is the forward's: `forward` takes it).
        """

    @abstractmethod
    def forward(self, model: Model, feed: Feed, *, cache: Any = None, mask: Array = None) -> Any:
        """The model's forward on ``feed``, as its own ``__call__`` runs it.

        Args:
            model: the loaded mlx-vlm model.
            feed: `feed`'s output.
            cache: the KV cache to extend (mlx-vlm's), or None.
            mask: the attention mask, or None.

        Returns:
            The model's output (``.logits``).
        """

    @abstractmethod
    def window(self, feed: Feed, start: int, end: int) -> dict[str, Any]:
        """The language model's inputs for positions ``[start, end)`` of ``feed``: a KV hit's tail.

        Args:
            feed: the whole prompt's `Feed` (batch 1).
            start: the first position to prefill.
            end: one past the last.

        Returns:
            Keyword arguments besides what vllm-mlx passes itself (position ids).
        """

    def reusable_prefix(
        self, model: Model, token_ids: Sequence[int], reused: int, stored: int | None
    ) -> bool:
        """Whether a prompt (``token_ids``) prefilled as the cached KV of its first ``reused``
        tokens, taken from a stored entry of ``stored`` tokens (None: not known), plus its tail
        gives what one prefill gives. True for the families whose layers all attend causally
        over an unbounded KV cache (the self-check proves a split on the loaded model)."""
        return True


def grid_tokens(grid: Array, merge_size: int) -> int:
    """Image tokens of a (1, 3) or (3,) grid ``t, h, w`` merged ``merge_size`` x ``merge_size``."""
    return int(math.prod(grid.reshape(-1).tolist())) // merge_size**2
