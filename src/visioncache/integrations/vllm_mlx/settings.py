"""How the engine's visioncache is configured: the ``--vision-cache-*`` flags and the cache they build.

vllm-mlx builds its vision cache with hard-coded settings (``enabled=True, size=100``). Here the
cache is sized and tiered by the launcher's flags (or `install`'s arguments), and namespaced by the
model's weights, its mlx-vlm configuration and its processor, so a disk or Redis tier shared by
several servers never serves features computed under another model or preprocessing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from visioncache import ConfigurationError, VisionEmbeddingCache
from visioncache.integrations.fingerprint import weights_digest
from visioncache.integrations.mlx_vlm.adapter import cache_namespace
from visioncache.trees import parse_byte_size

__all__ = ["VisionCacheSettings", "add_arguments", "weights_identity"]

_WEIGHT_SUFFIXES = (".safetensors", ".npz", ".gguf")


@dataclass(frozen=True)
class VisionCacheSettings:
    """Everything the integration needs besides vllm-mlx's own flags.

    ``model_id`` names the weights (e.g. ``org/name@revision``); when it is None the weights are
    identified by a blake3 digest of ``model_path``'s weight files (read once at start-up).
    """

    model_path: str | None = None
    model_id: str | None = None
    salt: str | None = None
    max_embedding_entries: int = 4096
    max_embedding_bytes: str = "2GiB"
    max_pixel_entries: int = 100
    max_pixel_bytes: str = "1GiB"
    disk_dir: str | None = None
    disk_max_bytes: str | None = None
    redis_url: str | None = None
    tiers_from_env: bool = False
    kv_reuse: bool = True

    def __post_init__(self) -> None:
        if self.model_path is None and self.model_id is None:
            raise ConfigurationError("name the model's weights: give model_path (a directory) or model_id")
        for name in ("max_embedding_bytes", "max_pixel_bytes", "disk_max_bytes"):
            parse_byte_size(getattr(self, name), name=name)  # a bad size fails here, at start-up
        if self.tiers_from_env and (self.disk_dir or self.redis_url):
            raise ConfigurationError("tiers come either from the environment or from disk_dir/redis_url")

    @classmethod
    def from_args(cls, args: argparse.Namespace, model_path: str | None) -> VisionCacheSettings:
        """Settings from the flags `add_arguments` defined (``args.vision_cache_*``)."""
        values = {field.name: getattr(args, f"vision_cache_{field.name}") for field in fields(cls)[1:]}
        return cls(model_path=model_path, **values)

    def namespace(self, model: Any, processor: Any) -> str:
        """The cache namespace: weights (see `weights_identity`) + model configuration + processor."""
        return cache_namespace(weights_identity(self), processor, model)

    def build_cache(self, namespace: str) -> VisionEmbeddingCache:
        """The engine's cache under ``namespace``, sized and tiered by these settings."""
        tiers: Any = "env" if self.tiers_from_env else self._tiers()
        return VisionEmbeddingCache(
            self.max_pixel_entries,
            0,  # the prompt-keyed encoding level is unused: features are cached per image
            namespace=namespace,
            salt=self.salt,
            max_pixel_bytes=self.max_pixel_bytes,
            max_embedding_entries=self.max_embedding_entries,
            max_embedding_bytes=self.max_embedding_bytes,
            tiers=tiers,
        )

    def _tiers(self) -> list[Any] | None:
        tiers: list[Any] = []
        if self.disk_dir is not None:
            from visioncache.tiers.disk import DiskTier

            tiers.append(DiskTier(self.disk_dir, parse_byte_size(self.disk_max_bytes, name="disk_max_bytes")))
        if self.redis_url is not None:
            from visioncache.tiers.redis import RedisTier

            tiers.append(RedisTier(self.redis_url))
        return tiers or None


def weights_identity(settings: VisionCacheSettings) -> str:
    """``settings.model_id``, else a digest of the weight files under ``settings.model_path``
    (read in full once per process and file state)."""
    if settings.model_id is not None:
        return settings.model_id
    assert settings.model_path is not None  # __post_init__ guarantees one of the two
    digest = weights_digest(Path(settings.model_path).resolve(), _WEIGHT_SUFFIXES)
    if digest is None:
        raise ConfigurationError(
            f"cannot identify the weights of {settings.model_path!r}: no weight files in a local "
            "directory; name them with --vision-cache-model-id (e.g. org/name@revision)"
        )
    return "weights:" + digest[:32]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's ``--vision-cache-*`` flags (defaults as `VisionCacheSettings`)."""
    group = parser.add_argument_group("visioncache")
    defaults = VisionCacheSettings(model_id="-")
    flag = "--vision-cache-"
    group.add_argument(flag + "model-id", help="names the weights (default: blake3 of the weight files)")
    group.add_argument(flag + "salt", help="tenant secret mixed into every key (KV ids included)")
    group.add_argument(flag + "max-embedding-entries", type=int, default=defaults.max_embedding_entries)
    group.add_argument(flag + "max-embedding-bytes", default=defaults.max_embedding_bytes, help="e.g. 4GiB")
    group.add_argument(flag + "max-pixel-entries", type=int, default=defaults.max_pixel_entries)
    group.add_argument(flag + "max-pixel-bytes", default=defaults.max_pixel_bytes)
    group.add_argument(flag + "disk-dir", help="disk tier directory (shared by processes, survives restarts)")
    group.add_argument(flag + "disk-max-bytes", help="disk tier budget, e.g. 20GiB")
    group.add_argument(flag + "redis-url", help="Redis/Valkey tier, redis://host:6379/0")
    group.add_argument(
        flag + "tiers-from-env", action="store_true", help="build tiers from VISIONCACHE_* variables instead"
    )
    group.add_argument(
        flag + "no-kv-reuse",
        dest="vision_cache_kv_reuse",
        action="store_false",
        help="keep vllm-mlx's KV prefix cache for text-only prompts (no image-aware keys)",
    )
