"""vLLM encoder-cache connector (``ec_connector_module_path: visioncache.integrations.vllm``), and
image handles in vLLM's OpenAI server (``--middleware visioncache.integrations.vllm.VisionCacheHandles``).

The connector itself needs vLLM and is imported on first use of its names, so the modules that
only parse its configuration, derive its namespace or store its items import without vLLM.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from visioncache.integrations.vllm.connector import VisionCacheECConnector, VisionCacheECMetadata
    from visioncache.integrations.vllm.handle_middleware import VisionCacheHandles
    from visioncache.integrations.vllm.versions import SUPPORTED

__all__ = ["SUPPORTED", "VisionCacheECConnector", "VisionCacheECMetadata", "VisionCacheHandles"]

_MODULES = {
    "SUPPORTED": "visioncache.integrations.vllm.versions",
    "VisionCacheECConnector": "visioncache.integrations.vllm.connector",
    "VisionCacheECMetadata": "visioncache.integrations.vllm.connector",
    "VisionCacheHandles": "visioncache.integrations.vllm.handle_middleware",
}


def __getattr__(name: str) -> Any:
    # vLLM's factory does getattr(import_module(path), "VisionCacheECConnector"): resolve lazily.
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
