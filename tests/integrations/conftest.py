"""Tiny random-weight Qwen2-VL / Qwen2.5-VL / Qwen3-VL models and small test images.

transformers is imported only by the fixtures that build models, so tests of other engines in
this folder run without the hf extra.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image

SIZES = [(56, 84), (112, 112), (70, 98), (84, 56)]  # (height, width): different grids


@pytest.fixture(scope="session", params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def family_model(request: pytest.FixtureRequest) -> tuple[str, Any, Any]:
    """(family, model, processor) for each supported family, built once per session."""
    pytest.importorskip("transformers")
    from visioncache.bench.models import build_offline_model

    model, processor = build_offline_model(request.param)
    return request.param, model, processor


@pytest.fixture(scope="session")
def images() -> list[Image.Image]:
    """Four distinct noise images of different sizes (so different grids and token counts)."""
    rng = np.random.default_rng(0)
    return [Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)) for h, w in SIZES]
