"""Counts real vision-encoder calls in vLLM: wraps Qwen2-VL's ``embed_multimodal``.

Every call appends one line, the number of items it encoded, to the file named by
``VISIONCACHE_TEST_ENCODER_LOG`` (O_APPEND: whole lines from several processes). vLLM's start-up
profiling and warm-up encode dummy items too, so tests read the count before and after a workload.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

ENV = "VISIONCACHE_TEST_ENCODER_LOG"


def install() -> None:
    """Wrap the model class once (idempotent); a no-op without the environment variable."""
    log = os.environ.get(ENV)
    if not log:
        return
    from vllm.model_executor.models.qwen2_vl import Qwen2VLForConditionalGeneration

    original = Qwen2VLForConditionalGeneration.embed_multimodal
    if getattr(original, "_visioncache_counted", False):
        return

    @functools.wraps(original)
    def counted(self: Any, **kwargs: object) -> Any:
        outputs = original(self, **kwargs)
        with open(log, "a") as handle:
            handle.write(f"{len(outputs)}\n")
        return outputs

    counted._visioncache_counted = True  # type: ignore[attr-defined]
    Qwen2VLForConditionalGeneration.embed_multimodal = counted


def encoded_items(log: str | os.PathLike[str]) -> int:
    """Items encoded so far, by every process writing to ``log``."""
    path = Path(log)
    if not path.exists():
        return 0
    return sum(int(line) for line in path.read_text().split())
