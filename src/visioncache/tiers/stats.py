"""Typed statistics of the shared tiers: what each tier answered, how its breaker stands."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from visioncache.tiers.breaker import CircuitBreaker

__all__ = ["ChainStats", "TierCounts", "TierSizes", "TierStats", "tier_stats"]


@dataclass(frozen=True)
class TierCounts:
    """What the chain counted for one tier."""

    hits: int = 0  # keys a batched read found intact here
    misses: int = 0
    errors: int = 0  # calls that raised (then the breaker opens)
    corrupt: int = 0  # damaged blobs, deleted
    unverified: int = 0  # blobs signed under a secret this chain does not accept, left in place
    writes: int = 0
    promotions: int = 0  # blobs copied up here from a lower tier


@dataclass(frozen=True)
class TierSizes:
    """What a tier knows about itself without a network call (`Tier.sizes`)."""

    entries: int | None = None  # None: the tier does not know cheaply (e.g. Redis)
    bytes: int | None = None
    max_bytes: int | None = None
    rejections: int = 0  # blobs larger than the tier's whole budget
    reopens: int = 0  # times the tier found its storage deleted or replaced, and reopened it


@dataclass(frozen=True, kw_only=True)
class TierStats(TierSizes, TierCounts):
    """One tier: the chain's `TierCounts`, the tier's own `TierSizes`, and its breaker."""

    name: str
    skipped: int = 0  # calls the open breaker answered without touching the tier
    breaker_opens: int = 0
    breaker_open: bool = False


def tier_stats(name: str, counts: TierCounts, breaker: CircuitBreaker, sizes: TierSizes) -> TierStats:
    """A `TierStats` from the chain's counts, the breaker and the tier's sizes."""
    return TierStats(
        **asdict(counts),
        **asdict(sizes),
        name=name,
        skipped=breaker.skipped,
        breaker_opens=breaker.opens,
        breaker_open=breaker.is_open,
    )


@dataclass(frozen=True)
class ChainStats:
    """Every tier of a chain, plus its write path."""

    tiers: tuple[TierStats, ...]
    unserializable: int = 0  # values not written because they cannot be serialised
    writes_pending: int = 0  # background writes queued or running
    writes_pending_bytes: int = 0
    writes_dropped: int = 0  # background writes dropped: the byte budget was full

    def tier(self, name: str) -> TierStats:
        """The stats of the tier called ``name`` (KeyError if there is none)."""
        for row in self.tiers:
            if row.name == name:
                return row
        raise KeyError(name)

    def to_dict(self) -> dict[str, dict[str, int | float]]:
        """``{tier name: {counter: value}, "chain": {...}}``, for ``get_stats()``."""
        result: dict[str, dict[str, int | float]] = {}
        for row in self.tiers:
            result[row.name] = {
                field.name: int(value)
                for field in fields(row)
                if field.name != "name" and (value := getattr(row, field.name)) is not None
            }
        result["chain"] = {
            field.name: getattr(self, field.name) for field in fields(self) if field.name != "tiers"
        }
        return result
