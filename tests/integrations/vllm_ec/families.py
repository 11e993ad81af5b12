"""The model families `make test-vllm` runs on real vLLM: how to build each tiny checkpoint and
which vLLM class's ``embed_multimodal`` is its vision encoder (counted by `encoder_counter`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.integrations.vllm_ec.tiny_gemma3 import save_tiny_gemma3
from tests.integrations.vllm_ec.tiny_gemma4 import save_tiny_gemma4
from tests.integrations.vllm_ec.tiny_model import save_tiny_qwen2_vl
from tests.integrations.vllm_ec.tiny_qwen import save_tiny_qwen2_5_vl, save_tiny_qwen3_vl
from tests.integrations.vllm_ec.tiny_tiled import (
    save_tiny_idefics3,
    save_tiny_internvl,
    save_tiny_llava_onevision,
)

__all__ = ["FAMILIES", "Family"]

_MODELS = "vllm.model_executor.models"


@dataclass(frozen=True)
class Family:
    name: str
    save: Callable[[Path], Path]
    encoder_model: str  # module:Class
    what_differs: str
    max_model_len: int | None = None  # engine_run's default unless its prompts need more
    # Tokens a step (vLLM's encoder cache holds as many): None, vLLM's default; more where vLLM
    # alone would evict one of the workload's images and encode it again.
    budget: int | None = None

    def __str__(self) -> str:
        return self.name


FAMILIES = (
    Family(
        "qwen2_vl",
        save_tiny_qwen2_vl,
        f"{_MODELS}.qwen2_vl:Qwen2VLForConditionalGeneration",
        "grid-sized pad run",
    ),
    Family(
        "qwen2_5_vl",
        save_tiny_qwen2_5_vl,
        f"{_MODELS}.qwen2_5_vl:Qwen2_5_VLForConditionalGeneration",
        "windowed vision attention",
    ),
    Family(
        "qwen3_vl",
        save_tiny_qwen3_vl,
        f"{_MODELS}.qwen3_vl:Qwen3VLForConditionalGeneration",
        "deepstack features in each output row (3x wider)",
    ),
    Family(
        "gemma3",
        save_tiny_gemma3,
        f"{_MODELS}.gemma3_mm:Gemma3ForConditionalGeneration",
        "16 embeddings inside an 18-token placeholder",
    ),
    Family(
        "llava_onevision",
        save_tiny_llava_onevision,
        f"{_MODELS}.llava_onevision:LlavaOnevisionForConditionalGeneration",
        "a base tile and an anyres grid, unpadded, with newline rows (anyres_max_9)",
        max_model_len=8192,
    ),
    Family(
        "idefics3",
        save_tiny_idefics3,
        f"{_MODELS}.idefics3:Idefics3ForConditionalGeneration",
        "512-px tiles and a global image, each 64 embeddings, between tile tokens",
        max_model_len=8192,
    ),
    Family(
        "internvl",
        save_tiny_internvl,
        f"{_MODELS}.interns1:InternS1ForConditionalGeneration",
        "1-12 dynamic 448-px tiles and a thumbnail, 256 embeddings each",
        max_model_len=16384,
        budget=16384,
    ),
    Family(
        "gemma4",
        save_tiny_gemma4,
        f"{_MODELS}.gemma4_mm:Gemma4ForConditionalGeneration",
        "up to 280 soft tokens by the image's aspect (16-px patches pooled 3x3), between markers",
    ),
)
