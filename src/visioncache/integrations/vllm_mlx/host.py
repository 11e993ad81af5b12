"""`ServerHost`: what the HTTP side (uploads, handles, forgetting) asks of the installation.

`install.Installation` is one; the HTTP modules take this Protocol instead of importing it, so
none of them imports `install` (which imports what they build on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from visioncache.errors import ConfigurationError
from visioncache.integrations.handles import Handles
from visioncache.integrations.vllm_mlx.prefix_cache import ImageAwarePrefixCache
from visioncache.integrations.vllm_mlx.step import EngineState

__all__ = ["ServerHost", "tenant_handles"]


class ServerHost(Protocol):
    """The engines, handles and tenants of a served installation."""

    @property
    def engines(self) -> Mapping[str, EngineState]: ...  # by cache namespace
    @property
    def prefix_caches(self) -> Sequence[ImageAwarePrefixCache]: ...
    @property
    def handles(self) -> Handles | None: ...

    verify_api_key: Any  # the API-key check of the server's routes (None: vllm-mlx's own)

    def request_tenant(self) -> str | None: ...
    def handles_for(self, tenant: str | None) -> Handles | None: ...
    def tenant_state(self, state: EngineState, tenant: str | None) -> EngineState: ...


def tenant_handles(host: ServerHost, tenant: str | None) -> Handles:
    """``tenant``'s image handles; the routes that ask are mounted only with handles on."""
    handles = host.handles_for(tenant)
    if handles is None:
        raise ConfigurationError("image handles are off here (--vision-cache-no-handles)")
    return handles
