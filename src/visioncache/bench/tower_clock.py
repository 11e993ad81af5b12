"""The model's vision tower module, and a clock of the time it runs (hooks on the module).

Why on the module: in ``off`` the tower runs inside the model's forward, in ``visioncache``
inside ``CachedVisionModel``; timing the module itself measures the same work in both, for any
family, wherever it runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["TOWER_NAMES", "TowerClock", "vision_tower"]

# Where transformers' VLMs keep the vision tower on their inner model.
TOWER_NAMES = ("visual", "vision_tower", "vision_model")


def vision_tower(model: Any) -> torch.nn.Module:
    """The vision tower module of a transformers VLM (``model.model.visual`` and the like)."""
    inner = getattr(model, "model", model)
    for name in TOWER_NAMES:
        tower = getattr(inner, name, None)
        if isinstance(tower, torch.nn.Module):
            return tower
    raise AttributeError(f"no vision tower ({', '.join(TOWER_NAMES)}) on {type(inner).__name__}")


@dataclass
class TowerTime:
    """Seconds the tower ran, and how many times, inside one `TowerClock.timing` block."""

    seconds: float = 0.0
    runs: int = 0
    _started: list[float] = field(default_factory=list, repr=False)


class TowerClock:
    """Times every run of ``model``'s vision tower inside a `timing` block."""

    def __init__(self, model: Any) -> None:
        self.module = vision_tower(model)

    @contextmanager
    def timing(self) -> Iterator[TowerTime]:
        elapsed = TowerTime()

        def before(*_: Any) -> None:
            elapsed._started.append(time.perf_counter())

        def after(_module: Any, _inputs: Any, output: Any) -> None:
            device = next(self.module.parameters()).device
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the tower's work, not just its launch
            elapsed.seconds += time.perf_counter() - elapsed._started.pop()
            elapsed.runs += 1

        handles = [self.module.register_forward_pre_hook(before), self.module.register_forward_hook(after)]
        try:
            yield elapsed
        finally:
            for handle in handles:
                handle.remove()
