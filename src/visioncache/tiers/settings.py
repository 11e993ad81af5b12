"""`TierSettings`: the one description of the shared tiers, and the one place that builds them.

Every integration configures its tiers with this type, from one of three sources that share the
names, the defaults (`visioncache.tiers.defaults`), the validation and the errors. The setting
``redis_timeout`` is:

- the environment variable ``VISIONCACHE_REDIS_TIMEOUT`` (`TierSettings.from_env`, which
  ``VisionEmbeddingCache.from_env()`` uses);
- the key ``redis_timeout`` of a mapping (`TierSettings.from_mapping`: vLLM's
  ``ec_connector_extra_config``);
- the flag ``--vision-cache-redis-timeout`` (`TierSettings.add_arguments` and `TierSettings.from_args`:
  ``visioncache serve-mlx``).

A value that does not parse raises `ConfigurationError` naming the setting as its source spells
it. Secrets are never written into a mapping or onto a command line (configurations are logged; a
command line is visible to every user of the host): there they are given by naming the
environment variable that holds them (``hmac_secret_env``, ``--vision-cache-hmac-secret-env``);
in the environment they are ``VISIONCACHE_HMAC_SECRET`` (and ``VISIONCACHE_HMAC_PREVIOUS_SECRETS``).
A variable named by ``hmac_secret_env`` may hold several secrets, comma-separated: the first
signs, every one verifies (rotation); ``VISIONCACHE_HMAC_SECRET`` is one secret, taken whole.
Reading settings opens nothing; `TierSettings.build_chain` constructs the tiers, which open
their files and connections at first use. docs/tiers.md lists every setting.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from visioncache.errors import ConfigurationError
from visioncache.tiers import defaults
from visioncache.tiers import setting_kinds as kinds
from visioncache.tiers.base import Tier
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier

__all__ = ["ENV_PREFIX", "FLAG_PREFIX", "TierSettings"]

ENV_PREFIX = "VISIONCACHE_"
FLAG_PREFIX = "--vision-cache-"


def _setting(default: Any, convert: kinds.Converter, help: str, *, old_names: tuple[str, ...] = ()) -> Any:
    return field(default=default, metadata={"convert": convert, "help": help, "old_names": old_names})


@dataclass(frozen=True)
class TierSettings:
    """The shared tiers below memory: a disk tier, a Redis/Valkey tier, or both, and their chain.

    Each field is a setting (see the module docstring for its three spellings); a field left at
    None configures no such tier. Sizes also accept strings such as ``"20GiB"``.
    """

    disk_dir: str | None = _setting(
        None, kinds.directory, "disk tier directory: shared by a host's processes, kept across restarts"
    )
    disk_max_bytes: int | None = _setting(
        None, kinds.size, "disk tier budget, e.g. 20GiB (default: the directory's own limit, 1GB when new)"
    )
    disk_timeout: float = _setting(
        defaults.DISK_TIMEOUT, kinds.seconds, "seconds a disk operation waits for another process's lock"
    )
    redis_url: str | None = _setting(
        None, kinds.redis_url, "Redis/Valkey tier shared by hosts: redis://, rediss:// or unix:// URL"
    )
    redis_prefix: str = _setting(defaults.REDIS_PREFIX, kinds.text, "prefix of every Redis key")
    redis_ttl: int | None = _setting(
        None,
        kinds.ttl,
        "seconds before a Redis entry expires (default: never)",
        old_names=("redis_ttl_seconds",),
    )
    redis_timeout: float = _setting(defaults.REDIS_TIMEOUT, kinds.seconds, "seconds per Redis operation")
    redis_cluster: bool = _setting(False, kinds.flag, "the Redis URL names a node of a Redis Cluster")
    redis_max_bytes: int | None = _setting(
        None,
        kinds.size,
        "Redis tier budget for the values under its prefix, least recently used evicted first "
        "(default: none, the server's maxmemory and the ttl bound it; one server, not a cluster)",
    )
    retry_interval: float = _setting(
        defaults.RETRY_INTERVAL,
        kinds.seconds,
        "seconds a failed tier is skipped before it is tried again",
        old_names=("redis_retry_interval",),
    )
    max_pending_write_bytes: int = _setting(
        defaults.MAX_PENDING_WRITE_BYTES,
        kinds.size_or_zero,
        "bytes of background writes queued at most (0: write on the caller's thread)",
    )
    secrets: tuple[bytes, ...] = field(default=(), repr=False)  # HMAC secrets: the first signs
    # How this source takes a secret: `UnsignedTierWarning` names it.
    secret_setting: str = field(default="TierSettings(secrets=...)", repr=False, compare=False)

    def __post_init__(self) -> None:
        for setting in _SETTINGS:
            value = getattr(self, setting.name)
            if value is not None or setting.default is not None:  # None: unset, where that means no tier
                object.__setattr__(self, setting.name, setting.convert(value, setting.name, False))
        secrets = tuple(self.secrets)
        if not all(isinstance(secret, bytes) and secret for secret in secrets):
            raise ConfigurationError("secrets: expected non-empty bytes")
        object.__setattr__(self, "secrets", secrets)

    @property
    def configured(self) -> bool:
        """Whether any tier is configured."""
        return self.disk_dir is not None or self.redis_url is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, prefix: str = ENV_PREFIX) -> TierSettings:
        """Settings from ``{prefix}NAME`` variables (``VISIONCACHE_DISK_DIR``, ...); an empty one is unset."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for setting in _SETTINGS:
            for name in (prefix + spelling.upper() for spelling in setting.names):
                text = environ.get(name, "").strip()
                if text:
                    values[setting.name] = setting.convert(text, name, True)
                    break
        # The signing secret is taken whole (a comma is part of it); earlier ones are a list. Set
        # but blank, it is refused, as a blank one named by hmac_secret_env is: read as "no
        # secret", it would write every entry unsigned.
        given = environ.get(prefix + "HMAC_SECRET")
        if given is not None and not given.strip():
            raise ConfigurationError(
                f"{prefix}HMAC_SECRET is set but blank: set a secret, or unset it to write unsigned entries"
            )
        current = tuple(filter(None, [(given or "").strip().encode()]))
        previous = kinds.split_secrets(environ.get(prefix + "HMAC_PREVIOUS_SECRETS", ""))
        if previous and not current:
            raise ConfigurationError(f"{prefix}HMAC_PREVIOUS_SECRETS is set without {prefix}HMAC_SECRET")
        return cls(**values, secrets=current + previous, secret_setting=prefix + "HMAC_SECRET")

    @classmethod
    def from_mapping(
        cls,
        mapping: Mapping[str, object] | None,
        *,
        environ: Mapping[str, str] | None = None,
        context: str = "tier settings",
        other_keys: Collection[str] = (),
    ) -> TierSettings:
        """Settings from a mapping's keys (``disk_dir``, ...; JSON types: a bool is ``true``, not
        ``"yes"``). ``hmac_secret_env`` names the environment variable holding the secret(s).
        ``other_keys`` are the caller's own keys: allowed, and left to it; any other key is an
        error (a typo must not silently turn a tier off). ``context`` names the mapping in errors."""
        given = dict(mapping or {})
        if "hmac_secret" in given:
            raise ConfigurationError(
                f"{context}: put the HMAC secret in an environment variable and name it in "
                "'hmac_secret_env'; a secret in the configuration would be logged"
            )
        known = sorted({*(setting.name for setting in _SETTINGS), "hmac_secret_env", *other_keys})
        accepted = {*known, *(old for setting in _SETTINGS for old in setting.old_names)}
        unknown = sorted(set(given) - accepted)
        if unknown:
            raise ConfigurationError(f"{context}: unknown key(s) {unknown}; known keys: {known}")
        values: dict[str, Any] = {}
        for setting in _SETTINGS:
            present = [name for name in setting.names if given.get(name) is not None]
            if len(present) > 1:
                raise ConfigurationError(f"{context}: {present} are one setting; keep {setting.name!r}")
            if present:
                values[setting.name] = setting.convert(given[present[0]], f"{context}.{present[0]}", False)
        label = f"{context}.hmac_secret_env"
        secrets = kinds.secrets_named_by(given.get("hmac_secret_env"), label, environ)
        return cls(**values, secrets=secrets, secret_setting=label)

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Define the ``--vision-cache-*`` tier flags on ``parser``, read back by `from_args`."""
        group = parser.add_argument_group("visioncache tiers", "shared tiers below memory (docs/tiers.md)")
        for setting in _SETTINGS:
            shown = "" if setting.default in (None, False) else f" (default: {_shown(setting.default)})"
            if setting.convert is kinds.flag:
                group.add_argument(
                    _flag_name(setting.name), action="store_true", default=None, help=setting.help
                )
            else:
                group.add_argument(_flag_name(setting.name), help=setting.help + shown)
        group.add_argument(
            FLAG_PREFIX + "hmac-secret-env",
            metavar="VARIABLE",
            help="environment variable holding the HMAC secret(s), comma-separated: the first signs",
        )
        group.add_argument(FLAG_PREFIX + "hmac-secret", help=argparse.SUPPRESS)  # refused, with the reason
        group.add_argument(
            FLAG_PREFIX + "tiers-from-env",
            action="store_true",
            help=f"build the tiers from {ENV_PREFIX}* variables instead of these flags",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, environ: Mapping[str, str] | None = None) -> TierSettings:
        """Settings from the flags `TierSettings.add_arguments` defined (``--vision-cache-disk-dir``, ...)."""
        if getattr(args, "vision_cache_hmac_secret", None) is not None:
            raise ConfigurationError(
                f"{FLAG_PREFIX}hmac-secret: a secret on the command line is visible to every user of "
                f"the host; put it in an environment variable and name it with {FLAG_PREFIX}hmac-secret-env"
            )
        values = {
            setting.name: setting.convert(value, _flag_name(setting.name), True)
            for setting in _SETTINGS
            if (value := getattr(args, _dest(setting.name))) is not None
        }
        secret_variable = args.vision_cache_hmac_secret_env
        if args.vision_cache_tiers_from_env:
            if values or secret_variable is not None:
                given = [_flag_name(name) for name in values] + [f"{FLAG_PREFIX}hmac-secret-env"] * (
                    secret_variable is not None
                )
                raise ConfigurationError(
                    f"{FLAG_PREFIX}tiers-from-env: the tiers come from {ENV_PREFIX}* variables or from "
                    f"{FLAG_PREFIX}* flags, not both (also given: {', '.join(given)})"
                )
            return cls.from_env(environ)
        label = f"{FLAG_PREFIX}hmac-secret-env"
        return cls(
            **values, secrets=kinds.secrets_named_by(secret_variable, label, environ), secret_setting=label
        )

    def build_tiers(self) -> list[Tier]:
        """The configured tiers, disk first (local, fast), then Redis/Valkey (shared); none opened."""
        tiers: list[Tier] = []
        if self.disk_dir is not None:
            # The directory's identity is checked on reads at most once per retry interval.
            tiers.append(
                DiskTier(
                    self.disk_dir,
                    self.disk_max_bytes,
                    timeout=self.disk_timeout,
                    check_interval=self.retry_interval,
                )
            )
        if self.redis_url is not None:
            from visioncache.tiers.redis import RedisTier  # the optional [redis] extra

            redis_tier = RedisTier(
                self.redis_url,
                key_prefix=self.redis_prefix,
                ttl_seconds=self.redis_ttl,
                socket_timeout=self.redis_timeout,
                cluster=self.redis_cluster,
                max_bytes=self.redis_max_bytes,
            )
            tiers.append(redis_tier)
        return tiers

    def build_chain(self) -> TierChain | None:
        """The chain of the configured tiers (None when none is): signed with ``secrets``, each
        tier skipped for ``retry_interval`` after a failure, writes queued in the background."""
        tiers = self.build_tiers()
        if not tiers:
            return None
        return TierChain(
            tiers,
            secrets=self.secrets,
            retry_interval=self.retry_interval,
            max_pending_write_bytes=self.max_pending_write_bytes,
            secret_setting=self.secret_setting,
        )


@dataclass(frozen=True)
class _Setting:
    """One field of `TierSettings` with what its metadata says about it."""

    name: str
    default: object
    convert: kinds.Converter
    help: str
    old_names: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The current name first, then older names still read."""
        return (self.name, *self.old_names)


_SETTINGS = tuple(
    _Setting(item.name, item.default, **item.metadata) for item in fields(TierSettings) if item.metadata
)


def _flag_name(name: str) -> str:
    return FLAG_PREFIX + name.replace("_", "-")


def _dest(name: str) -> str:
    return _flag_name(name).lstrip("-").replace("-", "_")


def _shown(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value and value % 2**20 == 0:
        return f"{value // 2**20}MiB"
    return str(value)
