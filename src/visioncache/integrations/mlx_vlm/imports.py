"""Import mlx and mlx-vlm on first use: the install command when they are missing, the pinned
mlx-vlm release checked before anything uses it.

mlx is an optional extra: importing ``visioncache`` never needs it, and a user who calls an mlx
integration without it installed gets `visioncache.extras`' one error, naming
``pip install 'visioncache[mlx]'``, instead of a bare ``ModuleNotFoundError`` from deep inside a call.
The family descriptions mirror mlx-vlm's model code (how each model merges image features, what
its language model is fed), which changes between releases without notice, so exactly one mlx-vlm
release is supported: another one is refused with a message naming both versions
(ConfigurationError), before any model is touched.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

from visioncache import ConfigurationError
from visioncache.extras import missing_extra, requires

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
    """Raise ConfigurationError unless the installed mlx-vlm is the supported release."""
    try:
        version = metadata.version("mlx-vlm")
    except metadata.PackageNotFoundError:
        raise missing_extra("mlx", _NEEDED_BY, "mlx_vlm") from None
    if version != SUPPORTED_MLX_VLM_VERSION:
        raise ConfigurationError(
            f"visioncache's mlx integration supports mlx-vlm {SUPPORTED_MLX_VLM_VERSION} only (its "
            f"family descriptions follow that release's model code), but {version} is installed: "
            f"pip install 'mlx-vlm=={SUPPORTED_MLX_VLM_VERSION}'"
        )


def import_mlx_vlm_utils() -> ModuleType:
    """``mlx_vlm.utils`` (and so mlx-vlm), or an ImportError naming the ``visioncache[mlx]`` extra;
    ConfigurationError for another mlx-vlm release than the supported one."""
    import_mlx()
    utils = _import("mlx_vlm.utils")
    check_mlx_vlm_version()
    return utils
