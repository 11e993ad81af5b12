"""The connector's settings, read from vLLM's ``ec_connector_extra_config``.

The tier keys are `visioncache.tiers.TierSettings`'s (``disk_dir``, ``redis_url``,
``hmac_secret_env``, ...: docs/tiers.md), read and checked by it; the connector adds
``namespace`` and ``ignore_cache_salt``. Every key is checked before anything starts, and an
unknown key is an error (a typo must not silently turn a tier off): a bad configuration fails
vLLM's start-up with a message naming the key. The HMAC secret is never in the configuration
itself (it would be logged and copied into every process's arguments); the configuration names
the environment variable that holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from visioncache.errors import ConfigurationError
from visioncache.tiers import TierSettings

__all__ = ["ConnectorConfig"]

_PREFIX = "ec_connector_extra_config"
_OWN_KEYS = ("namespace", "ignore_cache_salt")
# Removed keys, each with why: an old configuration fails with the reason, not "unknown key".
_REMOVED = {
    "trust_client_uuids": "entries are keyed by the encoder's inputs, never by an item's identifier, so "
    "items named by a client (multi_modal_uuids) are cached as safely as any: remove the key",
}


@dataclass(frozen=True)
class ConnectorConfig:
    """Parsed ``ec_connector_extra_config``; `from_extra_config` documents each key."""

    tiers: TierSettings
    namespace: str | None = None
    ignore_cache_salt: bool = False

    @classmethod
    def from_extra_config(
        cls, extra: Mapping[str, object] | None, environ: Mapping[str, str] | None = None
    ) -> ConnectorConfig:
        """Parse the tier keys (`TierSettings.from_mapping`; at least one of ``disk_dir`` and
        ``redis_url`` is required) and the connector's own: ``namespace`` replaces the derived
        namespace (weights, processor, dtype, versions) — only for operators who version their
        models themselves; ``ignore_cache_salt: true`` puts every request in one shared, public
        namespace whatever its ``cache_salt`` (by default a request's ``cache_salt`` is its
        tenant: it keys the request's entries, so tenants share none).
        """
        settings = dict(extra or {})
        for key, reason in _REMOVED.items():
            if key in settings:
                raise ConfigurationError(f"{_PREFIX}.{key} no longer exists: {reason}")
        tiers = TierSettings.from_mapping(settings, environ=environ, context=_PREFIX, other_keys=_OWN_KEYS)
        if not tiers.configured:
            raise ConfigurationError(f"{_PREFIX}: set 'disk_dir', 'redis_url' or both (no tier configured)")
        namespace = settings.get("namespace")
        if namespace is not None and (not isinstance(namespace, str) or not namespace.strip()):
            raise ConfigurationError(f"{_PREFIX}.namespace: expected a non-empty string, got {namespace!r}")
        ignore_cache_salt = settings.get("ignore_cache_salt", False)
        if not isinstance(ignore_cache_salt, bool):
            raise ConfigurationError(
                f"{_PREFIX}.ignore_cache_salt: expected true or false, got {ignore_cache_salt!r}"
            )
        return cls(tiers=tiers, namespace=namespace, ignore_cache_salt=ignore_cache_salt)
