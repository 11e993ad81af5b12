"""Tiers from configuration: ``VISIONCACHE_*`` environment variables, or what ``tiers=`` accepts.

Every setting is checked when it is read: a value that does not parse (``nan`` seconds, a
malformed Redis URL, a disk directory that is a file, ``REDIS_CLUSTER=maybe``) raises
`ConfigurationError` naming the variable. Reading the settings opens nothing (see `TierChain`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import cast

from visioncache.errors import ConfigurationError
from visioncache.tiers.base import Tier
from visioncache.tiers.chain import DEFAULT_MAX_PENDING_WRITE_BYTES, TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.trees import parse_byte_size

__all__ = ["ENV_PREFIX", "chain_from_env", "chain_from_spec"]

ENV_PREFIX = "VISIONCACHE_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


class _Settings:
    """Typed reads of ``{prefix}NAME`` variables, each failing with the variable's name."""

    def __init__(self, prefix: str, environ: Mapping[str, str]) -> None:
        self.prefix = prefix
        self.environ = environ

    def text(self, name: str) -> str | None:
        value = self.environ.get(self.prefix + name, "").strip()
        return value or None

    def seconds(self, name: str, default: float, *, allow_zero: bool = False) -> float:
        text = self.text(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise ConfigurationError(
                f"{self.prefix}{name}: expected a positive number of seconds, got {text!r}"
            )
        return value

    def byte_size(self, name: str, default: int | None) -> int | None:
        text = self.text(name)
        return default if text is None else parse_byte_size(text, name=self.prefix + name)

    def flag(self, name: str) -> bool:
        text = (self.text(name) or "").lower()
        if text not in _TRUE + _FALSE:
            raise ConfigurationError(f"{self.prefix}{name}: expected 1/0, true/false or yes/no, got {text!r}")
        return text in _TRUE


def chain_from_env(prefix: str = ENV_PREFIX, environ: Mapping[str, str] | None = None) -> TierChain | None:
    """A chain configured by environment variables; None when no tier is configured.

    ``{prefix}DISK_DIR``: directory of a disk tier (under /dev/shm: shared memory).
    ``{prefix}DISK_MAX_BYTES``: its budget, e.g. ``20GiB`` (default: the directory's stored limit,
    or diskcache's 1 GB for a new one). ``{prefix}DISK_TIMEOUT``: seconds an operation waits for
    the directory's lock (default 1).
    ``{prefix}REDIS_URL``: ``redis://`` / ``rediss://`` URL of a Redis/Valkey tier;
    ``{prefix}REDIS_PREFIX`` its key prefix (default ``visioncache:``); ``{prefix}REDIS_TTL``
    seconds before entries expire (default or 0: never); ``{prefix}REDIS_CLUSTER`` ``1`` for a
    Redis Cluster; ``{prefix}REDIS_TIMEOUT`` per-operation timeout in seconds (default 0.25).
    ``{prefix}RETRY_INTERVAL``: seconds a failed tier is skipped (default 5).
    ``{prefix}HMAC_SECRET``: sign and check every blob with HMAC-SHA256 under this secret;
    ``{prefix}HMAC_PREVIOUS_SECRETS``: comma-separated secrets still accepted (rotation).
    ``{prefix}MAX_PENDING_WRITE_BYTES``: bytes of background writes queued at most (default
    ``256MiB``; 0: write on the caller's thread).
    """
    settings = _Settings(prefix, os.environ if environ is None else environ)
    tiers: list[Tier] = []
    disk_dir = settings.text("DISK_DIR")
    if disk_dir is not None:
        if os.path.exists(disk_dir) and not os.path.isdir(disk_dir):
            raise ConfigurationError(f"{prefix}DISK_DIR: {disk_dir!r} exists and is not a directory")
        tiers.append(
            DiskTier(
                disk_dir,
                settings.byte_size("DISK_MAX_BYTES", None),
                timeout=settings.seconds("DISK_TIMEOUT", 1.0),
            )
        )
    redis_url = settings.text("REDIS_URL")
    if redis_url is not None:
        from visioncache.tiers.redis import RedisTier  # redis-py is an optional extra

        ttl = settings.seconds("REDIS_TTL", 0, allow_zero=True)
        try:
            tier = RedisTier(
                redis_url,
                key_prefix=settings.environ.get(prefix + "REDIS_PREFIX", "visioncache:"),
                ttl_seconds=int(ttl) or None,
                socket_timeout=settings.seconds("REDIS_TIMEOUT", 0.25),
                cluster=settings.flag("REDIS_CLUSTER"),
            )
        except ConfigurationError as error:
            raise ConfigurationError(f"{prefix}REDIS_URL: {error}") from None
        tiers.append(tier)
    if not tiers:
        return None
    secret = settings.text("HMAC_SECRET")
    previous = [
        item.strip() for item in (settings.text("HMAC_PREVIOUS_SECRETS") or "").split(",") if item.strip()
    ]
    if previous and secret is None:
        raise ConfigurationError(f"{prefix}HMAC_PREVIOUS_SECRETS is set without {prefix}HMAC_SECRET")
    secrets = [item.encode() for item in ([secret] if secret else []) + previous]
    interval = settings.seconds("RETRY_INTERVAL", settings.seconds("REDIS_RETRY_INTERVAL", 5.0))
    pending = settings.byte_size("MAX_PENDING_WRITE_BYTES", DEFAULT_MAX_PENDING_WRITE_BYTES)
    return TierChain(tiers, secrets=secrets, retry_interval=interval, max_pending_write_bytes=pending or 0)


def chain_from_spec(spec: TierChain | Sequence[Tier] | str | None) -> TierChain | None:
    """A chain from what ``VisionEmbeddingCache(tiers=...)`` accepts: a chain, a list of tiers,
    None (memory only), or ``"env"`` (`chain_from_env`)."""
    if spec is None or isinstance(spec, TierChain):
        return spec
    if spec == "env":
        return chain_from_env()
    if isinstance(spec, str | bytes) or not isinstance(spec, Sequence):
        raise ConfigurationError(f"tiers must be a TierChain, a list of tiers, None or 'env': {spec!r}")
    tiers: list[Tier] = list(cast(Sequence[Tier], spec))
    return TierChain(tiers) if tiers else None
