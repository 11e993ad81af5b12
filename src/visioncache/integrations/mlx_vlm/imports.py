"""Import mlx and mlx-vlm on first use, failing with the install command when they are missing.

mlx is an optional extra: importing ``visioncache`` never needs it, and a user who calls an mlx
integration without it installed gets `visioncache.extras`' one error, naming
``pip install 'visioncache[mlx]'``, instead of a bare ``ModuleNotFoundError`` from deep inside a call.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from visioncache.extras import requires

__all__ = ["import_mlx", "import_mlx_vlm_utils"]


def _import(module_name: str) -> ModuleType:
    with requires("mlx", "the mlx integration (mlx, mlx-vlm and, on Linux, mlx-cpu)"):
        return importlib.import_module(module_name)


def import_mlx() -> ModuleType:
    """``mlx.core``, or an ImportError naming the ``visioncache[mlx]`` extra."""
    return _import("mlx.core")


def import_mlx_vlm_utils() -> ModuleType:
    """``mlx_vlm.utils`` (and so mlx-vlm), or an ImportError naming the ``visioncache[mlx]`` extra."""
    import_mlx()
    return _import("mlx_vlm.utils")
