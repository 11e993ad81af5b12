"""The connector's settings, read from vLLM's ``ec_connector_extra_config``.

Every key is checked before anything starts, and an unknown key is an error (a typo must not
silently turn a tier off): a bad configuration fails vLLM's start-up with a message naming the
key. The HMAC secret is never in the configuration itself (it would be logged and copied into
every process's arguments); the configuration names the environment variable that holds it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from visioncache.errors import ConfigurationError
from visioncache.trees import parse_byte_size

__all__ = ["ConnectorConfig"]

_PREFIX = "ec_connector_extra_config"
_DEFAULT_PENDING_WRITE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class ConnectorConfig:
    """Parsed ``ec_connector_extra_config``; `from_extra_config` documents each key."""

    disk_dir: str | None = None
    disk_max_bytes: int | None = None
    redis_url: str | None = None
    redis_cluster: bool = False
    redis_prefix: str = "visioncache:"
    redis_timeout: float = 0.25
    redis_ttl_seconds: int | None = None
    retry_interval: float = 5.0
    secrets: tuple[bytes, ...] = ()
    namespace: str | None = None
    max_pending_write_bytes: int = _DEFAULT_PENDING_WRITE_BYTES
    trust_client_uuids: bool = False

    @classmethod
    def from_extra_config(
        cls, extra: Mapping[str, object] | None, environ: Mapping[str, str] | None = None
    ) -> ConnectorConfig:
        """Parse the keys below; at least one of ``disk_dir`` and ``redis_url`` is required.

        ``disk_dir`` (str), ``disk_max_bytes`` (int or "20GiB"): a disk tier, shared by the
        processes of a host and kept across restarts (``/dev/shm/...`` for shared memory).
        ``redis_url`` (``redis://`` or ``rediss://``), ``redis_cluster`` (bool), ``redis_prefix``,
        ``redis_timeout`` (seconds per operation, default 0.25), ``redis_ttl_seconds``: a
        Redis/Valkey tier shared by hosts. ``retry_interval``: seconds a failing tier is skipped
        (default 5). ``hmac_secret_env``: the NAME of an environment variable holding the HMAC
        secret (or several, comma-separated: the first signs, any verifies). ``namespace``:
        replaces the derived namespace (weights, processor, dtype, hash algorithm) — only for
        operators who version their models themselves. ``max_pending_write_bytes``: bytes of
        encoder outputs queued for the background writer (default 256MiB; beyond it a save is
        dropped and counted, never waited for). ``trust_client_uuids`` (default false): cache
        items whose identifier is a client-supplied ``multi_modal_uuids`` value rather than
        vLLM's content hash.
        """
        env = os.environ if environ is None else environ
        settings = dict(extra or {})
        known = {
            "disk_dir",
            "disk_max_bytes",
            "redis_url",
            "redis_cluster",
            "redis_prefix",
            "redis_timeout",
            "redis_ttl_seconds",
            "retry_interval",
            "hmac_secret_env",
            "namespace",
            "max_pending_write_bytes",
            "trust_client_uuids",
        }
        if "hmac_secret" in settings:
            raise ConfigurationError(
                f"{_PREFIX}: put the HMAC secret in an environment variable and name it in "
                "'hmac_secret_env'; a secret in the configuration would be logged"
            )
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ConfigurationError(f"{_PREFIX}: unknown key(s) {unknown}; known keys: {sorted(known)}")
        disk_dir = _optional_str(settings, "disk_dir")
        redis_url = _optional_str(settings, "redis_url")
        if disk_dir is None and redis_url is None:
            raise ConfigurationError(f"{_PREFIX}: set 'disk_dir', 'redis_url' or both (no tier configured)")
        if redis_url is not None and not redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(f"{_PREFIX}: 'redis_url' must start with redis://, rediss:// or unix://")
        ttl = settings.get("redis_ttl_seconds")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0):
            raise ConfigurationError(f"{_PREFIX}: 'redis_ttl_seconds' must be a positive int, got {ttl!r}")
        pending = parse_byte_size(
            _size(settings, "max_pending_write_bytes", _DEFAULT_PENDING_WRITE_BYTES),
            name=f"{_PREFIX}.max_pending_write_bytes",
        )
        return cls(
            disk_dir=disk_dir,
            disk_max_bytes=parse_byte_size(
                _size(settings, "disk_max_bytes", None), name=f"{_PREFIX}.disk_max_bytes"
            ),
            redis_url=redis_url,
            redis_cluster=_bool(settings, "redis_cluster", False),
            redis_prefix=_optional_str(settings, "redis_prefix") or "visioncache:",
            redis_timeout=_positive(settings, "redis_timeout", 0.25),
            redis_ttl_seconds=ttl,
            retry_interval=_positive(settings, "retry_interval", 5.0),
            secrets=_secrets(settings, env),
            namespace=_optional_str(settings, "namespace"),
            max_pending_write_bytes=_DEFAULT_PENDING_WRITE_BYTES if pending is None else pending,
            trust_client_uuids=_bool(settings, "trust_client_uuids", False),
        )


def _optional_str(settings: Mapping[str, object], key: str) -> str | None:
    value = settings.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{_PREFIX}: {key!r} must be a non-empty string, got {value!r}")
    return value


def _bool(settings: Mapping[str, object], key: str, default: bool) -> bool:
    value = settings.get(key, default)
    if not isinstance(value, bool):
        raise ConfigurationError(f"{_PREFIX}: {key!r} must be true or false, got {value!r}")
    return value


def _positive(settings: Mapping[str, object], key: str, default: float) -> float:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigurationError(f"{_PREFIX}: {key!r} must be a number > 0, got {value!r}")
    return float(value)


def _size(settings: Mapping[str, object], key: str, default: int | None) -> int | str | None:
    value = settings.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | str)):
        raise ConfigurationError(f"{_PREFIX}: {key!r} must be an int or a size like '2GiB', got {value!r}")
    return value


def _secrets(settings: Mapping[str, object], env: Mapping[str, str]) -> tuple[bytes, ...]:
    name = _optional_str(settings, "hmac_secret_env")
    if name is None:
        return ()
    value = env.get(name, "")
    secrets = tuple(part.strip().encode() for part in value.split(",") if part.strip())
    if not secrets:
        raise ConfigurationError(
            f"{_PREFIX}: 'hmac_secret_env' names {name!r}, but that environment variable is unset or empty"
        )
    return secrets
