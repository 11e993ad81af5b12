"""One family description applied to a model and its processor: per-image preprocessing, one
vision-tower call for many images split back per image, and model inputs from cached values.

Why one class for every family: a `Family` states facts, this applies them, so each family is
cached the same way (``docs/families.md``). A cached value holds everything a request needs
from its image: the embedding rows (and deepstack rows), the text the image's placeholder
expands to, and the per-image inputs the forward still takes, so a hit needs neither the image
processor nor the processor's counting. Nothing here touches the cache; the adapter
(``adapter.py``) and the load-time check (``exactness.py``) both call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from transformers import PreTrainedModel, ProcessorMixin
from transformers.modeling_outputs import BaseModelOutputWithPooling

from visioncache.errors import ConfigurationError
from visioncache.integrations.transformers.families import Family

__all__ = ["FamilyEncoder", "join"]


def join(tensors: Sequence[torch.Tensor], dim: int, pad_value: float = 0.0) -> torch.Tensor:
    """Concatenate per-image tensors on ``dim``, first padding every other axis (at its end) to
    the largest: how image processors batch images of different sizes."""
    ndim = tensors[0].dim()
    shape = [max(int(tensor.shape[axis]) for tensor in tensors) for axis in range(ndim)]
    padded = []
    for tensor in tensors:
        missing = [0 if axis == dim else shape[axis] - int(tensor.shape[axis]) for axis in range(ndim)]
        if any(missing):
            widths = [width for axis in reversed(range(ndim)) for width in (0, missing[axis])]
            tensor = torch.nn.functional.pad(tensor, widths, value=pad_value)
        padded.append(tensor)
    return torch.cat(padded, dim=dim)


class FamilyEncoder:
    """Applies ``family`` to ``model`` and ``processor``."""

    def __init__(self, family: Family, model: PreTrainedModel, processor: ProcessorMixin) -> None:
        self.family = family
        self.model: Any = model
        self.processor: Any = processor
        # The keyword sets the processor's own __call__ builds (its defaults merged with the
        # tokenizer's), so images and texts are prepared exactly as processor(...) prepares them.
        merge: Any = processor._merge_kwargs
        merged = merge(
            self.processor.valid_processor_kwargs,
            tokenizer_init_kwargs=self.processor.tokenizer.init_kwargs,
            padding=True,
            return_tensors="pt",
        )
        self.images_kwargs: dict[str, Any] = dict(merged["images_kwargs"])
        text_kwargs = dict(merged["text_kwargs"])
        default_types = merged.get("return_mm_token_type_ids", False)
        self.mm_token_types = bool(text_kwargs.pop("return_mm_token_type_ids", default_types))
        text_kwargs.pop("return_text_replacement_offsets", None)
        self.text_kwargs = text_kwargs
        self.image_token_id = int(model.config.image_token_id)
        self.kept_inputs = tuple(dict.fromkeys((*family.encoder_inputs, *family.forward_inputs)))

    # ---- one image -----------------------------------------------------------------------------
    def preprocess(self, image: Image.Image, variant: str | None) -> dict[str, Any]:
        """One image's processor outputs (those the tower and the forward take) and the text its
        placeholder expands to, as the processor computes both."""
        outputs, replacements = self.family.preprocess(
            self.processor, [image], variant, dict(self.images_kwargs)
        )
        if len(replacements) != 1:
            raise ConfigurationError(
                f"{self.family.name}: the image step returned {len(replacements)} expansions for one image"
            )
        inputs = {name: torch.as_tensor(outputs[name]) for name in self.kept_inputs}
        return {"replacement": replacements[0], "inputs": inputs}

    def token_count(self, replacement: str) -> int:
        """How many embedding rows an image whose placeholder expands to ``replacement`` takes:
        its image tokens, counted on the tokenizer (special tokens are atomic in context too)."""
        ids = self.processor.tokenizer(replacement, add_special_tokens=False)["input_ids"]
        return int(list(ids).count(self.image_token_id))

    # ---- a tower call ----------------------------------------------------------------------------
    def encode(self, entries: Sequence[dict[str, Any]], variant: str | None = None) -> list[dict[str, Any]]:
        """The vision tower on ``entries`` (preprocessed images of one variant) in one call, its
        output split back per image by each image's token count."""
        family, model = self.family, self.model
        batch = {
            name: join(
                [entry["inputs"][name] for entry in entries],
                family.batch_dim,
                family.pad_values.get(name, 0.0),
            ).to(model.device)
            for name in family.encoder_inputs
        }
        extra = family.encoder_kwargs(variant, len(entries)) if family.encoder_kwargs is not None else {}
        # no_grad, not inference_mode: cached tensors must stay usable in a later autograd forward.
        with torch.no_grad():
            output = model.get_image_features(**batch, **extra)
        counts = [self.token_count(entry["replacement"]) for entry in entries]
        embeddings = self._split(output.pooler_output, counts, "embeddings")
        layers = [self._split(layer, counts, "deepstack features") for layer in self._deepstack(output)]
        values = []
        for index, entry in enumerate(entries):
            value: dict[str, Any] = {
                "embeddings": embeddings[index],
                "replacement": entry["replacement"],
                "inputs": {name: entry["inputs"][name] for name in family.forward_inputs},
            }
            if family.deepstack:
                value["deepstack_features"] = [layer[index] for layer in layers]
            values.append(value)
        return values

    def _deepstack(self, output: Any) -> list[Any]:
        if not self.family.deepstack:
            return []
        layers = getattr(output, "deepstack_features", None)
        if not layers:
            raise ConfigurationError(f"{self.family.name}: the vision tower returned no deepstack features")
        return list(layers)

    def _split(self, pooled: Any, counts: list[int], what: str) -> list[torch.Tensor]:
        """Per image, its part of the tower's output, by the family's split; each part must have
        one row per image token of its image."""
        parts = self.family.split(pooled, counts)
        rows = [int(part.reshape(-1, part.shape[-1]).shape[0]) for part in parts]
        if rows != counts:
            raise ConfigurationError(
                f"{self.family.name}: the vision tower's {what} split into {rows} rows per image for "
                f"{counts} image tokens: the placeholder count does not match the encoder output"
            )
        return [part.reshape(-1, part.shape[-1]) for part in parts]

    # ---- model inputs ----------------------------------------------------------------------------
    def text_inputs(
        self, texts: Sequence[str], image_replacements: Sequence[str], video_replacements: Sequence[str] = ()
    ) -> dict[str, Any]:
        """The tokenised texts with each placeholder expanded, as the processor's __call__ writes
        them (its text keywords, its token-type ids, its output names)."""
        expanded, _ = self.processor.get_text_with_replacements(
            list(texts), list(image_replacements), list(video_replacements)
        )
        inputs: dict[str, Any] = dict(self.processor.tokenizer(expanded, **self.text_kwargs))
        if self.mm_token_types:
            types = self.processor.create_mm_token_type_ids(inputs["input_ids"])
            inputs["mm_token_type_ids"] = torch.as_tensor(types)
        for name, renamed in self.family.text_renames.items():
            if name in inputs:
                inputs[renamed] = inputs.pop(name)
        return inputs

    def image_inputs(self, values: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The per-image forward inputs and ``mm_encoder_outputs["image"]`` of cached values."""
        family = self.family
        inputs: dict[str, Any] = {
            name: join([value["inputs"][name] for value in values], 0, family.pad_values.get(name, 0.0))
            for name in family.forward_inputs
        }
        deepstack = [value.get("deepstack_features") for value in values] if family.deepstack else None
        inputs["mm_encoder_outputs"] = {
            "image": self.encoder_output([v["embeddings"] for v in values], deepstack)
        }
        return inputs

    def encoder_output(
        self, embeddings: list[torch.Tensor], deepstack: list[Any] | None = None
    ) -> BaseModelOutputWithPooling:
        """Per-item embeddings (and deepstack rows) as the encoder output the forward reads."""
        pooled: Any = tuple(embeddings) if self.family.pooled_as == "tuple" else torch.cat(embeddings)
        if deepstack is None:
            return self.family.output_class(pooler_output=pooled)
        layers = len(deepstack[0] or [])
        per_layer: Any = [
            tuple(item[layer] for item in deepstack if item is not None) for layer in range(layers)
        ]
        return self.family.output_class(pooler_output=pooled, deepstack_features=per_layer)  # type: ignore[call-arg]

    def model_inputs(
        self,
        texts: Sequence[str],
        values: Sequence[dict[str, Any]],
        video_replacements: Sequence[str] = (),
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``model(**inputs)`` keywords for a padded batch of texts and the values of its images,
        in placeholder order, on the model's device."""
        inputs = self.text_inputs(texts, [value["replacement"] for value in values], video_replacements)
        if values:
            inputs.update(self.image_inputs(values))
        if extra:
            encoder_outputs = {**inputs.get("mm_encoder_outputs", {}), **extra.pop("mm_encoder_outputs", {})}
            inputs.update(extra)
            if encoder_outputs:
                inputs["mm_encoder_outputs"] = encoder_outputs
        device = self.model.device
        return {
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in inputs.items()
        }
