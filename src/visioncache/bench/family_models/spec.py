"""What a family's offline model builder returns, and the tiny text model every family shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel, ProcessorMixin

__all__ = ["TINY_TEXT", "FamilyModel"]

# A two-layer language model: the prefill is cheap and every image token still reaches the logits.
TINY_TEXT: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)


@dataclass(frozen=True)
class FamilyModel:
    """A random-weight model of a family, its offline processor, and the text a prompt holds for
    one image (what the family's chat template writes)."""

    family: str
    model: PreTrainedModel
    processor: ProcessorMixin
    placeholder: str
