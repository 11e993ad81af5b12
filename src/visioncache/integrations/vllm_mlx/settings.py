"""How the engine's visioncache is configured: the ``--vision-cache-*`` flags and the cache they build.

vllm-mlx builds its vision cache with hard-coded settings (``enabled=True, size=100``). Here the
cache is sized by the launcher's flags (or `install`'s arguments), tiered by the tier flags of
`visioncache.tiers.TierSettings` (the same settings as ``VISIONCACHE_*`` and vLLM's connector),
and namespaced by the model's weights, its mlx-vlm configuration and its processor, so a disk or
Redis tier shared by several servers never serves features computed under another model or
preprocessing.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from visioncache import ConfigurationError, VisionEmbeddingCache
from visioncache.integrations.fingerprint import weights_digest
from visioncache.integrations.mlx_vlm import cache_namespace
from visioncache.integrations.vllm_mlx.tenants import TenantKeys
from visioncache.tiers import TierSettings
from visioncache.trees import parse_byte_size

__all__ = ["VisionCacheSettings", "add_arguments", "weights_identity"]

_WEIGHT_SUFFIXES = (".safetensors", ".npz", ".gguf")
MAX_KV_BYTES_VARIABLE = "VISIONCACHE_MAX_KV_BYTES"  # --vision-cache-max-kv-bytes, from the environment


@dataclass(frozen=True)
class VisionCacheSettings:
    """Everything the integration needs besides vllm-mlx's own flags.

    ``model_id`` names the weights (e.g. ``org/name@revision``); when it is None the weights are
    identified by a blake3 digest of ``model_path``'s weight files (read once at start-up).
    ``tiers``: the shared tiers (`visioncache.tiers.TierSettings`; none by default).
    ``tenants_file`` / ``tenants_env``: the API key -> tenant secret map (`tenants`), from a file
    or an environment variable; ``salt`` is the one-tenant case (not both).
    ``refuse_unsupported``: a model visioncache cannot serve (no family description, or its
    self-check fails) raises ConfigurationError when vllm-mlx builds its engine, as
    ``visioncache serve-mlx`` asks; by default such a model runs stock vllm-mlx's code, with one
    warning.
    """

    model_path: str | None = None
    model_id: str | None = None
    salt: str | None = None
    max_embedding_entries: int = 4096
    max_embedding_bytes: str = "2GiB"
    max_pixel_entries: int = 100
    max_pixel_bytes: str = "1GiB"
    kv_reuse: bool = True
    handles: bool = True  # image handles: POST /v1/visioncache/images, visioncache:// image URLs
    max_handle_bytes: str = "512MiB"  # memory budget of the images' bytes kept for their handles
    max_kv_bytes: str = "1GiB"  # the tiers' budget for image-aware KV prefixes (`kv_tiers`; "0": none)
    tenants_file: str | None = None
    tenants_env: str | None = None
    tiers: TierSettings = field(default_factory=TierSettings)
    refuse_unsupported: bool = False

    def __post_init__(self) -> None:
        if self.model_path is None and self.model_id is None:
            raise ConfigurationError("name the model's weights: give model_path (a directory) or model_id")
        for name in ("max_embedding_bytes", "max_pixel_bytes", "max_handle_bytes", "max_kv_bytes"):
            parse_byte_size(getattr(self, name), name=name)  # a bad size fails here, at start-up
        given = [name for name in ("salt", "tenants_file", "tenants_env") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ConfigurationError(
                f"give one of salt (one tenant), tenants_file and tenants_env (tenants by API key), "
                f"not {given}"
            )

    @classmethod
    def from_options(cls, **options: Any) -> VisionCacheSettings:
        """`install`'s keyword options: these fields, plus `TierSettings`' fields for the tiers
        (``disk_dir=...``, ``redis_url=...``, ``secrets=[...]``) or ``tiers_from_env=True``."""
        tier_options = {name: options.pop(name) for name in list(options) if name in _TIER_FIELDS}
        if options.pop("tiers_from_env", False):
            if tier_options or "tiers" in options:
                raise ConfigurationError("tiers come either from the environment or from disk_dir/redis_url")
            options["tiers"] = TierSettings.from_env()
            budget = os.environ.get(MAX_KV_BYTES_VARIABLE, "").strip()
            if budget:
                options.setdefault("max_kv_bytes", budget)
        elif tier_options:
            if "tiers" in options:
                raise ConfigurationError("give tiers=TierSettings(...) or its fields, not both")
            options["tiers"] = TierSettings(**tier_options, secret_setting="install(secrets=[...])")
        return cls(**options)

    @classmethod
    def from_args(cls, args: argparse.Namespace, model_path: str | None) -> VisionCacheSettings:
        """Settings from the flags `add_arguments` defined (``args.vision_cache_*``)."""
        values = {name: getattr(args, f"vision_cache_{name}") for name in _OWN_FLAGS}
        if values["max_kv_bytes"] is None:  # the flag, else the environment, else the default
            values["max_kv_bytes"] = os.environ.get(MAX_KV_BYTES_VARIABLE, "").strip() or _MAX_KV_BYTES
        salt_variable = getattr(args, "vision_cache_salt_env", None)
        if salt_variable is not None:
            if values["salt"] is not None:
                raise ConfigurationError("give --vision-cache-salt or --vision-cache-salt-env, not both")
            values["salt"] = os.environ.get(salt_variable, "")
            if not values["salt"]:
                raise ConfigurationError(
                    f"--vision-cache-salt-env names {salt_variable!r}, but that environment variable is "
                    "unset or empty"
                )
        return cls(model_path=model_path, tiers=TierSettings.from_args(args), **values)

    def tenant_keys(self) -> TenantKeys | None:
        """The API key -> tenant secret map, read now (None: one tenant, or none)."""
        if self.tenants_file is not None:
            return TenantKeys.from_file(self.tenants_file)
        if self.tenants_env is not None:
            return TenantKeys.from_env(self.tenants_env)
        return None

    def namespace(self, model: Any, processor: Any) -> str:
        """The cache namespace: weights (see `weights_identity`) + model configuration + processor."""
        return cache_namespace(weights_identity(self), processor, model)

    def build_cache(self, namespace: str) -> VisionEmbeddingCache:
        """The engine's cache under ``namespace``, sized and tiered by these settings."""
        return VisionEmbeddingCache(
            self.max_pixel_entries,
            0,  # the prompt-keyed encoding level is unused: features are cached per image
            namespace=namespace,
            salt=self.salt,
            max_pixel_bytes=self.max_pixel_bytes,
            max_embedding_entries=self.max_embedding_entries,
            max_embedding_bytes=self.max_embedding_bytes,
            tiers=self.tiers,
        )


_MAX_KV_BYTES = VisionCacheSettings.max_kv_bytes
_TIER_FIELDS = frozenset(item.name for item in fields(TierSettings)) - {"secret_setting"}
_OWN_FLAGS = tuple(
    item.name
    for item in fields(VisionCacheSettings)
    if item.name not in {"model_path", "tiers", "refuse_unsupported"}
)


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
    """The launcher's ``--vision-cache-*`` flags (defaults as `VisionCacheSettings`), the tier
    flags (`TierSettings.add_arguments`) included."""
    group = parser.add_argument_group("visioncache")
    defaults = VisionCacheSettings(model_id="-")
    flag = "--vision-cache-"
    group.add_argument(flag + "model-id", help="names the weights (default: blake3 of the weight files)")
    group.add_argument(
        flag + "salt",
        help="tenant secret mixed into every key (KV ids, image handles included); visible to every "
        "user of the host on the command line: prefer --vision-cache-salt-env",
    )
    group.add_argument(
        flag + "salt-env", help="environment variable holding the tenant secret (--vision-cache-salt)"
    )
    group.add_argument(
        flag + "tenants-file",
        help='tenants by API key: a JSON file {"<api key>": "<tenant secret>", ...} (the keys replace '
        "--api-key)",
    )
    group.add_argument(
        flag + "tenants-env", help="environment variable holding that JSON (--vision-cache-tenants-file)"
    )
    group.add_argument(flag + "max-embedding-entries", type=int, default=defaults.max_embedding_entries)
    group.add_argument(flag + "max-embedding-bytes", default=defaults.max_embedding_bytes, help="e.g. 4GiB")
    group.add_argument(flag + "max-pixel-entries", type=int, default=defaults.max_pixel_entries)
    group.add_argument(flag + "max-pixel-bytes", default=defaults.max_pixel_bytes)
    group.add_argument(
        flag + "max-handle-bytes",
        default=defaults.max_handle_bytes,
        help="memory budget of the image bytes kept for handles (the tiers keep them too)",
    )
    group.add_argument(
        flag + "max-kv-bytes",
        help=f"budget of the image-aware KV prefixes kept in the tiers, e.g. 20GiB (least recently used "
        f"evicted; 0: none kept; default: ${MAX_KV_BYTES_VARIABLE}, else {defaults.max_kv_bytes})",
    )
    group.add_argument(
        flag + "no-handles",
        dest="vision_cache_handles",
        action="store_false",
        help="no image handles (POST /v1/visioncache/images and visioncache:// image URLs)",
    )
    group.add_argument(
        flag + "no-kv-reuse",
        dest="vision_cache_kv_reuse",
        action="store_false",
        help="keep vllm-mlx's KV prefix cache for text-only prompts (no image-aware keys)",
    )
    TierSettings.add_arguments(parser)
