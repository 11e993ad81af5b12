"""Shared tiers below memory: local disk and Redis/Valkey, the chain that owns them, the background
writer, the serialization of array trees, and `TierSettings`, the one way to configure them. The
face of the tiers package: it re-exports (the Redis tier lives in `visioncache.tiers.redis`, which
needs ``visioncache[redis]``)."""

from visioncache.tiers.base import BaseTier, Tier
from visioncache.tiers.chain import (
    DEFAULT_MAX_PENDING_WRITE_BYTES,
    TierChain,
    UnsignedTierWarning,
    WritesAtClose,
)
from visioncache.tiers.config import ENV_PREFIX, chain_from_env, chain_from_spec
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.settings import TierSettings
from visioncache.tiers.stats import ChainStats, TierCounts, TierSizes, TierStats

__all__ = [
    "DEFAULT_MAX_PENDING_WRITE_BYTES",
    "ENV_PREFIX",
    "BaseTier",
    "ChainStats",
    "DiskTier",
    "Tier",
    "TierChain",
    "TierCounts",
    "TierSettings",
    "TierSizes",
    "TierStats",
    "UnsignedTierWarning",
    "WritesAtClose",
    "chain_from_env",
    "chain_from_spec",
]
