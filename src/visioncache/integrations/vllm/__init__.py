"""vLLM encoder-cache connector (``ec_connector_module_path: visioncache.integrations.vllm``).

The connector itself needs vLLM and is imported on first use of its names, so the modules that
only parse its configuration, derive its namespace or store its items import without vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from visioncache.integrations.vllm.connector import (
        SUPPORTED_VLLM_VERSION,
        VisionCacheECConnector,
        VisionCacheECMetadata,
    )

__all__ = ["SUPPORTED_VLLM_VERSION", "VisionCacheECConnector", "VisionCacheECMetadata"]


def __getattr__(name: str) -> Any:
    # vLLM's factory does getattr(import_module(path), "VisionCacheECConnector"): resolve lazily.
    if name in __all__:
        from visioncache.integrations.vllm import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
