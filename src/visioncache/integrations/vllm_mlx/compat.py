"""The vllm-mlx version this integration is written against, checked before anything is patched.

The integration wraps a few methods of vllm-mlx's ``MLLMBatchGenerator`` (listed in the package
docstring). Their bodies are not stable API, so exactly one release is supported; another one is
refused with a message naming both versions, before any attribute is touched, so vllm-mlx is
never left half-patched.
"""

from __future__ import annotations

import importlib
import inspect
from importlib import metadata
from types import ModuleType

from visioncache import ConfigurationError
from visioncache.extras import missing_extra
from visioncache.versions import require_version

__all__ = [
    "INSTALL_HINT",
    "PATCHED_FUNCTION",
    "REQUIRED_METHODS",
    "SUPPORTED_VLLM_MLX_VERSION",
    "import_batch_generator_module",
    "import_scheduler_module",
    "installed_version",
]

SUPPORTED_VLLM_MLX_VERSION = "0.6.0"
INSTALL_HINT = f"pip install 'visioncache[vllm-mlx]' (vllm-mlx=={SUPPORTED_VLLM_MLX_VERSION})"

# Every MLLMBatchGenerator method the integration wraps (patches.GENERATOR_METHODS) or calls, with
# the parameters it relies on, and the module function it replaces.
REQUIRED_METHODS = {
    "__init__": ("model", "processor", "prefix_cache_config"),
    "_process_prompts": ("requests",),
    "_preprocess_request": ("request",),
    "_language_model_kwargs": ("request", "position_start", "position_end"),
    "_run_vision_encoding": ("request", "cache"),
    "get_vision_cache_stats": (),
    # called, not patched:
    "_release_preprocessed_inputs": ("request",),
}
PATCHED_FUNCTION = "is_text_only_prefix_cache_request"
_REQUIRED_REQUEST_FIELDS = ("images", "videos", "audio", "prompt", "input_ids", "extra_kwargs")


def installed_version() -> str | None:
    """The installed vllm-mlx distribution's version, or None when it is not installed."""
    try:
        return metadata.version("vllm-mlx")
    except metadata.PackageNotFoundError:
        return None


def _check_version() -> str:
    installed = installed_version()
    if installed is None:
        raise missing_extra("vllm-mlx", "the vllm-mlx integration", "vllm_mlx", INSTALL_HINT)
    return str(
        require_version(
            "vllm-mlx",
            f"=={SUPPORTED_VLLM_MLX_VERSION}",
            installed=installed,
            needed_by="visioncache's vllm-mlx integration",
            why="the methods it wraps are not stable API; nothing was patched",
            extra="vllm-mlx",
        )
    )


def import_batch_generator_module() -> ModuleType:
    """``vllm_mlx.mllm_batch_generator`` after checking the version and every seam used.

    Raises ConfigurationError (vllm-mlx missing, another version, or a seam that changed).
    """
    version = _check_version()
    module = importlib.import_module("vllm_mlx.mllm_batch_generator")
    problems = _seam_problems(module)
    if problems:
        raise ConfigurationError(
            f"vllm-mlx {version} does not have the code this integration patches "
            f"({'; '.join(problems)}); nothing was patched"
        )
    return module


def import_scheduler_module() -> ModuleType:
    """``vllm_mlx.mllm_scheduler`` after checking the version and its seams (the scheduler is built
    at server start with the loaded model and processor; ``add_request`` returns the id of a
    request, in the handling of the HTTP request that made it)."""
    version = _check_version()
    module = importlib.import_module("vllm_mlx.mllm_scheduler")
    scheduler = getattr(module, "MLLMScheduler", None)
    for name, parameters in (("__init__", {"model", "processor"}), ("add_request", {"prompt", "images"})):
        method = inspect.getattr_static(scheduler, name, None) if scheduler is not None else None
        if method is None or not parameters <= set(inspect.signature(method).parameters):
            raise ConfigurationError(
                f"vllm-mlx {version} does not have the code this integration patches "
                f"(MLLMScheduler.{name}({', '.join(sorted(parameters))}, ...)); nothing was patched"
            )
    return module


def _seam_problems(module: ModuleType) -> list[str]:
    problems = []
    generator = getattr(module, "MLLMBatchGenerator", None)
    if generator is None:
        return ["no MLLMBatchGenerator"]
    for name, parameters in REQUIRED_METHODS.items():
        method = inspect.getattr_static(generator, name, None)
        if method is None:
            problems.append(f"no MLLMBatchGenerator.{name}")
            continue
        function = method.__func__ if isinstance(method, staticmethod | classmethod) else method
        missing = set(parameters) - set(inspect.signature(function).parameters)
        if missing:
            problems.append(f"MLLMBatchGenerator.{name} lacks {sorted(missing)}")
    if not callable(getattr(module, PATCHED_FUNCTION, None)):
        problems.append(f"no {PATCHED_FUNCTION}")
    fields = getattr(getattr(module, "MLLMBatchRequest", None), "__dataclass_fields__", {})
    problems += [f"MLLMBatchRequest has no {name}" for name in _REQUIRED_REQUEST_FIELDS if name not in fields]
    return problems
