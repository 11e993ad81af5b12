"""The optional packages the tests use, or None: with only ``pip install -e .`` (no extras),
``pytest tests`` runs the core and skips what needs an extra, naming the extra that brings it."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

__all__ = ["mx", "needs_mlx", "needs_redis", "needs_torch", "optional", "skip_without", "torch"]


def optional(name: str) -> ModuleType | None:
    """Module ``name``, or None when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


torch = optional("torch")
mx = optional("mlx.core")
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch: pip install 'visioncache[hf]'")
needs_mlx = pytest.mark.skipif(mx is None, reason="needs mlx: pip install 'visioncache[mlx]'")
needs_redis = pytest.mark.skipif(
    optional("redis") is None, reason="needs redis-py: pip install 'visioncache[redis]'"
)


def skip_without(module: str, extra: str) -> None:
    """Skip the calling test module unless ``module`` imports (``pytest.importorskip``)."""
    pytest.importorskip(module, reason=f"needs {module}: pip install 'visioncache[{extra}]'")
