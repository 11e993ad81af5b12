"""Where a store's values live: the device budget's settings and the placement seam.

A level whose values live on an accelerator (torch CUDA, MPS, XPU) keeps them there, within a
device byte budget of its own; `Store` spills the least-recently-used unpinned device entries to
host memory when that budget is full, and places a spilled entry back on its device at its next
hit. What is an accelerator, how a value is copied to the host and back, and how much memory a
device has free are this module's `Placement`: one small seam, so the spill logic runs in tests
with real CPU tensors and a fake device, and the real torch path stays thin. MLX uses unified
memory: its arrays are host memory here.

Settings (the ``device_bytes`` argument of `Store`, ``max_embedding_device_bytes`` of the cache):

- ``"auto"`` (`AUTO`, the embedding level's default): `AUTO_FRACTION` of the device's free memory,
  read at the level's first device value (``torch.cuda.mem_get_info``); `AUTO_FALLBACK_BYTES` when
  the device cannot say;
- ``"N%"``: N percent (0 < N <= 100) of the free memory, read the same way;
- a byte size (an int, or a string such as ``"8GiB"``): exactly that; ``0`` keeps nothing on the
  device (every value is copied to the host when stored);
- None: no device budget, and no residency: every byte counts against the host budget, wherever it
  lives (the other levels' setting).
"""

from __future__ import annotations

import re
import sys
from decimal import Decimal
from typing import Any, Protocol

from visioncache.errors import ConfigurationError
from visioncache.trees import parse_byte_size, place_on

__all__ = [
    "ACCELERATORS",
    "AUTO",
    "AUTO_FALLBACK_BYTES",
    "AUTO_FRACTION",
    "DeviceBudget",
    "Placement",
    "TorchPlacement",
    "parse_device_budget",
]

AUTO = "auto"
AUTO_FRACTION = Decimal("0.25")  # of the device's free memory at the level's first device value
AUTO_FALLBACK_BYTES = 2 * 2**30  # when the device does not report its free memory
ACCELERATORS = frozenset({"cuda", "mps", "xpu"})  # torch device types whose memory is not the host's
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


class Placement(Protocol):
    """How values move between a device and the host (the seam tests replace)."""

    def home(self, device: Any) -> Any | None:
        """``device`` (a leaf's device, from `visioncache.trees.prepare`) if its memory is an
        accelerator's that the device budget governs, else None (host memory)."""
        ...

    def to_host(self, value: Any) -> Any:
        """A copy of ``value`` in host memory."""
        ...

    def to_device(self, value: Any, device: Any) -> Any:
        """A copy of ``value`` on ``device``."""
        ...

    def free_bytes(self, device: Any) -> int | None:
        """Bytes free on ``device`` now, or None when it cannot say."""
        ...


class TorchPlacement:
    """torch's accelerators: tensors move with ``Tensor.to``; free memory from the backend."""

    def home(self, device: Any) -> Any | None:
        return device if getattr(device, "type", None) in ACCELERATORS else None

    def to_host(self, value: Any) -> Any:
        return place_on(value, "cpu")

    def to_device(self, value: Any, device: Any) -> Any:
        return place_on(value, device)

    def free_bytes(self, device: Any) -> int | None:
        torch = sys.modules.get("torch")
        kind = getattr(device, "type", None)
        try:
            if torch is None:
                return None
            if kind == "cuda":
                return int(torch.cuda.mem_get_info(device)[0])
            if kind == "xpu" and hasattr(torch.xpu, "mem_get_info"):
                return int(torch.xpu.mem_get_info(device)[0])
            if kind == "mps" and hasattr(torch.mps, "recommended_max_memory"):
                return int(torch.mps.recommended_max_memory()) - int(torch.mps.driver_allocated_memory())
        except (RuntimeError, AttributeError, TypeError):  # no driver, or an older backend
            return None
        return None


class DeviceBudget:
    """A parsed device budget: bytes, or a fraction of free memory resolved at first use."""

    __slots__ = ("fraction", "limit")

    def __init__(self, limit: int | None = None, fraction: Decimal | None = None):
        self.limit = limit  # bytes, once known
        self.fraction = fraction  # of free memory, until resolved

    def resolve(self, placement: Placement, device: Any) -> int:
        """The budget in bytes, reading ``device``'s free memory the first time if it is a fraction."""
        if self.limit is None:
            free = placement.free_bytes(device) if self.fraction is not None else None
            self.limit = AUTO_FALLBACK_BYTES if free is None else int(max(free, 0) * (self.fraction or 0))
        return self.limit

    def __repr__(self) -> str:
        return f"<DeviceBudget {self.limit if self.limit is not None else f'{self.fraction:%} of free'}>"


def parse_device_budget(value: object, *, name: str = "device_bytes") -> DeviceBudget | None:
    """``"auto"``, ``"N%"``, a byte size, or None (see the module docstring); anything else
    raises `ConfigurationError`."""
    if value is None:
        return None
    if value == AUTO:
        return DeviceBudget(fraction=AUTO_FRACTION)
    if isinstance(value, str) and (match := _PERCENT.match(value)):
        percent = Decimal(match.group(1))
        if not 0 < percent <= 100:
            raise ConfigurationError(
                f"{name}: a percentage of free device memory must be in (0, 100], got {value!r}"
            )
        return DeviceBudget(fraction=percent / 100)
    if not isinstance(value, int | str) or isinstance(value, bool):
        raise ConfigurationError(
            f"{name} must be 'auto', a percentage such as '25%', a byte size such as '8GiB', or None; "
            f"got {value!r}"
        )
    return DeviceBudget(limit=parse_byte_size(value, name=name))
