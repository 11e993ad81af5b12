"""Import mlx and mlx-vlm on first use: the install command when they are missing, the pinned
mlx-vlm release checked before anything uses it.

mlx is an optional extra: importing ``visioncache`` never needs it, and a user who calls an mlx
integration without it installed gets `visioncache.extras`' one error, naming
``pip install 'visioncache[mlx]'``, instead of a bare ``ModuleNotFoundError`` from deep inside a call.
The family descriptions mirror mlx-vlm's model code (how each model merges image features, what
its language model is fed), which changes between releases without notice, so exactly one mlx-vlm
release is supported: another one is refused with a message naming both versions
(`visioncache.versions.UnsupportedVersionError`), before any model is touched.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from visioncache.extras import requires
from visioncache.versions import require_version

__all__ = ["SUPPORTED_MLX_VLM_VERSION", "check_mlx_vlm_version", "import_mlx", "import_mlx_vlm_utils"]

SUPPORTED_MLX_VLM_VERSION = "0.7.10"
_NEEDED_BY = "the mlx integration (mlx, mlx-vlm and, on Linux, mlx-cpu)"


def _import(module_name: str) -> ModuleType:
    with requires("mlx", _NEEDED_BY):
        return importlib.import_module(module_name)


def import_mlx() -> ModuleType:
    """``mlx.core``, or an ImportError naming the ``visioncache[mlx]`` extra."""
    return _import("mlx.core")


def check_mlx_vlm_version() -> None:
    """Refuse another mlx-vlm release than the supported one (`UnsupportedVersionError`, a
    ConfigurationError); `MissingExtraError` when mlx-vlm is not installed."""
    require_version(
        "mlx-vlm",
        f"=={SUPPORTED_MLX_VLM_VERSION}",
        needed_by="visioncache's mlx integration",
        why="its family descriptions follow that release's model code",
        extra="mlx",
    )


def import_mlx_vlm_utils() -> ModuleType:
    """``mlx_vlm.utils`` (and so mlx-vlm), or an ImportError naming the ``visioncache[mlx]`` extra;
    ConfigurationError for another mlx-vlm release than the supported one."""
    import_mlx()
    utils = _import("mlx_vlm.utils")
    check_mlx_vlm_version()
    return utils
