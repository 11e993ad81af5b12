"""The store's value types: what `Store` keeps per key, hands to a claimer, returns and reports."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["Claim", "Entry", "PutResult", "StoreStats"]


class PutResult(Enum):
    INSERTED = "inserted"
    REPLACED = "replaced"
    REJECTED = "rejected"
    DISABLED = "disabled"


@dataclass(slots=True)
class Entry:
    """A stored value, its size, and the seconds it cost to compute (added to time saved per hit)."""

    value: Any
    nbytes: int
    cost: float
    priority: float = 0.0  # the eviction policy's, if it keeps one
    ticket: int = 0  # the eviction policy's: which of its records is this entry's current one
    device: Any = None  # the accelerator ``value`` lives on now, None for host memory
    home: Any = None  # the accelerator it was stored from: spilled while ``device`` is None

    @property
    def spilled(self) -> bool:
        """Copied to the host when the device budget was full; placed back at its next hit."""
        return self.home is not None and self.device is None


@dataclass(slots=True)
class Claim:
    """The outcome of `Store.claim`: a hit (``value``), a wait (``future``), or ownership."""

    value: Any = None
    cost: float = 0.0
    future: Future[Any] | None = None
    owner: bool = False

    @property
    def hit(self) -> bool:
        return self.future is None


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A consistent snapshot of one store: what lookups found, what the budget did, what it holds."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rejections: int = 0
    singleflight_waits: int = 0
    validation_failures: int = 0
    computed: int = 0
    spills: int = 0  # device entries copied to the host to make room on the device
    restores: int = 0  # spilled entries placed back on their device by a hit
    time_saved: float = 0.0  # seconds of recorded work that hits avoided
    entries: int = 0
    bytes: int = 0
    pinned: int = 0
    device_bytes: int = 0  # of ``bytes``, held on an accelerator (the device budget's)
    host_bytes: int = 0  # of ``bytes``, held in host memory (the host budget's)
