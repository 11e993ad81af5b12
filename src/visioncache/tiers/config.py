"""What ``VisionEmbeddingCache(tiers=...)`` accepts, as a chain; the environment's tiers.

Both build through `visioncache.tiers.settings.TierSettings`, the one owner of tier settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from visioncache.errors import ConfigurationError
from visioncache.tiers.base import Tier
from visioncache.tiers.chain import TierChain
from visioncache.tiers.settings import ENV_PREFIX, TierSettings

__all__ = ["ENV_PREFIX", "chain_from_env", "chain_from_spec"]


def chain_from_env(prefix: str = ENV_PREFIX, environ: Mapping[str, str] | None = None) -> TierChain | None:
    """The chain ``{prefix}*`` variables configure (`TierSettings.from_env`); None when no tier is."""
    return TierSettings.from_env(environ, prefix=prefix).build_chain()


def chain_from_spec(spec: TierChain | TierSettings | Sequence[Tier] | str | None) -> TierChain | None:
    """A chain from what ``VisionEmbeddingCache(tiers=...)`` accepts: a chain, `TierSettings`, a
    list of tiers, None (memory only), or ``"env"`` (`chain_from_env`)."""
    if spec is None or isinstance(spec, TierChain):
        return spec
    if isinstance(spec, TierSettings):
        return spec.build_chain()
    if spec == "env":
        return chain_from_env()
    if isinstance(spec, str | bytes) or not isinstance(spec, Sequence):
        raise ConfigurationError(
            f"tiers must be a TierChain, TierSettings, a list of tiers, None or 'env': {spec!r}"
        )
    tiers: list[Tier] = list(cast(Sequence[Tier], spec))
    return TierChain(tiers) if tiers else None
