"""Import mlx and mlx-vlm on first use, failing with the install command when they are missing.

mlx is an optional extra: importing ``visioncache`` never needs it, and a user who calls an mlx
integration without it installed is told exactly what to install instead of seeing a bare
``ModuleNotFoundError`` from deep inside a call.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["INSTALL_HINT", "import_mlx", "import_mlx_vlm_utils"]

INSTALL_HINT = (
    "the mlx integration needs mlx and mlx-vlm (and mlx-cpu on Linux): pip install 'visioncache[mlx]'"
)


def _import(module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT}; importing {module_name!r} failed: {error}") from error


def import_mlx() -> ModuleType:
    """``mlx.core``, or an ImportError naming the ``visioncache[mlx]`` extra."""
    return _import("mlx.core")


def import_mlx_vlm_utils() -> ModuleType:
    """``mlx_vlm.utils`` (and so mlx-vlm), or an ImportError naming the ``visioncache[mlx]`` extra."""
    import_mlx()
    return _import("mlx_vlm.utils")
