"""Every vllm-mlx name the integration touches, in one table, checked before any is used.

vllm-mlx's internals are not stable API, so exactly one release is supported (another is refused
with a message naming both versions), and `SEAMS` lists each name the integration patches, calls,
reads, or relies on vllm-mlx's code assigning, with the parameters it passes or the fields it reads.
A module of vllm-mlx is imported only through `checked_module`, which checks the version and every
seam of that module first: a release that renamed one fails with its name, before anything is
patched. `patches` and `install` derive what they replace from the table (`patched`), and
tests/integrations/vllm_mlx/test_vllm_mlx_seams.py ties the table to the code: every seam exists in
the supported release, the replacements are exactly the patched seams, and no module of the
integration imports vllm-mlx except through here.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Literal

from visioncache import ConfigurationError, forking
from visioncache.extras import missing_extra
from visioncache.versions import require_version

__all__ = [
    "INSTALL_HINT",
    "SEAMS",
    "SUPPORTED_VLLM_MLX_VERSION",
    "Seam",
    "checked_module",
    "import_batch_generator_module",
    "import_scheduler_module",
    "installed_version",
    "patched",
    "seam_problems",
]

SUPPORTED_VLLM_MLX_VERSION = "0.6.0"
INSTALL_HINT = f"pip install 'visioncache[vllm-mlx]' (vllm-mlx=={SUPPORTED_VLLM_MLX_VERSION})"

Use = Literal["patched", "called", "read", "assigned"]
GENERATOR = "vllm_mlx.mllm_batch_generator"
SCHEDULER = "vllm_mlx.mllm_scheduler"


@dataclass(frozen=True)
class Seam:
    """One vllm-mlx name: ``module``'s attribute ``path`` (dotted: ``Class.method``) and its use.

    ``patched``: replaced by `install` (its ``parameters`` are the ones the replacement relies on);
    ``called``: called with ``parameters``; ``read``: read (for a dataclass, ``parameters`` are
    the fields read); ``assigned``: an instance attribute vllm-mlx's code assigns in ``module``
    and the integration reads (checked in the module's source).
    """

    module: str
    path: str
    use: Use
    parameters: tuple[str, ...] = ()

    @property
    def owner(self) -> str:
        """The class holding the name, or "" for a module-level name."""
        return self.path.rpartition(".")[0]

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2]


SEAMS: tuple[Seam, ...] = (
    # the batch generator (patches.py: generator replacements)
    Seam(GENERATOR, "MLLMBatchGenerator.__init__", "patched", ("model", "processor", "prefix_cache_config")),
    Seam(GENERATOR, "MLLMBatchGenerator._process_prompts", "patched", ("requests",)),
    Seam(GENERATOR, "MLLMBatchGenerator._preprocess_request", "patched", ("request",)),
    Seam(GENERATOR, "MLLMBatchGenerator._run_vision_encoding", "patched", ("request", "cache")),
    Seam(
        GENERATOR,
        "MLLMBatchGenerator._language_model_kwargs",
        "patched",
        ("request", "position_start", "position_end"),
    ),
    Seam(GENERATOR, "MLLMBatchGenerator.get_vision_cache_stats", "patched"),
    Seam(GENERATOR, "is_text_only_prefix_cache_request", "patched", ("request",)),
    Seam(GENERATOR, "MLLMBatchGenerator._release_preprocessed_inputs", "called", ("request",)),
    Seam(
        GENERATOR,
        "MLLMBatchRequest",
        "read",
        ("images", "videos", "audio", "prompt", "input_ids", "extra_kwargs"),
    ),
    # the scheduler (patches.py: scheduler replacements): built at server start with the model
    Seam(SCHEDULER, "MLLMScheduler.__init__", "patched", ("model", "processor")),
    Seam(SCHEDULER, "MLLMScheduler.add_request", "patched", ("prompt", "images")),
    # the prefix cache the generator's prefix_cache wraps (prefix_cache.py)
    Seam("vllm_mlx.memory_cache", "MemoryAwarePrefixCache._last_matched_key", "assigned"),
    # images (images.py, uploads.py)
    Seam("vllm_mlx.models.mllm", "process_image_input", "called", ("image",)),
    Seam("vllm_mlx.models.mllm", "MAX_BASE64_IMAGE_LENGTH", "read"),
    Seam("vllm_mlx.models.mllm", "MAX_IMAGE_SIZE", "read"),
    # videos (video_handles.py): what stock reads a video with, and its limits
    Seam("vllm_mlx.models.mllm", "extract_video_frames_smart", "called", ("video_path", "fps", "max_frames")),
    Seam("vllm_mlx.models.mllm", "DEFAULT_FPS", "read"),
    Seam("vllm_mlx.models.mllm", "MAX_FRAMES", "read"),
    Seam("vllm_mlx.models.mllm", "MAX_VIDEO_SIZE", "read"),
    Seam("vllm_mlx.models.mllm", "MAX_BASE64_VIDEO_LENGTH", "read"),
    # the server (launcher.py, handle_api.py, tenants.py, metrics.py)
    Seam("vllm_mlx.cli", "create_parser", "called"),
    Seam("vllm_mlx.cli", "serve_command", "called", ("args",)),
    Seam("vllm_mlx.server", "app", "read"),
    Seam("vllm_mlx.server", "security", "read"),
    Seam("vllm_mlx.server", "verify_api_key", "read", ("credentials",)),
    Seam("vllm_mlx.metrics", "metrics", "read"),
)

_checked: set[str] = set()  # modules whose seams passed
_checked_lock = forking.lock()


def patched(module: str, owner: str) -> tuple[str, ...]:
    """The names `install` replaces in ``module``'s ``owner`` ("" for module functions), in table order."""
    return tuple(s.name for s in SEAMS if s.module == module and s.owner == owner and s.use == "patched")


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


def checked_module(name: str, *, again: bool = False) -> ModuleType:
    """vllm-mlx's module ``name``, after checking the version and every seam the table lists in it.

    A module's seams are checked once per process (request paths ask for modules per image);
    ``again`` checks them anew (`install` does, so nothing is patched over a changed seam).

    Raises:
        visioncache.errors.MissingExtraError: vllm-mlx is not installed.
        visioncache.versions.UnsupportedVersionError: another vllm-mlx release is installed.
        ConfigurationError: a seam of ``name`` is missing or changed its parameters.
    """
    if name in _checked and not again:  # checked once: from here on a sys.modules lookup
        return importlib.import_module(name)
    version = _check_version()  # reads the distribution's metadata: 0.4 ms, not per request
    module = importlib.import_module(name)
    problems = seam_problems(module)
    if problems:
        raise ConfigurationError(
            f"vllm-mlx {version} does not have the code this integration uses "
            f"({'; '.join(problems)}); nothing was patched"
        )
    with _checked_lock:
        _checked.add(name)
    return module


def import_batch_generator_module() -> ModuleType:
    """``vllm_mlx.mllm_batch_generator``, checked, with the prefix cache module it wraps."""
    module = checked_module(GENERATOR, again=True)
    checked_module("vllm_mlx.memory_cache", again=True)
    return module


def import_scheduler_module() -> ModuleType:
    """``vllm_mlx.mllm_scheduler``, checked."""
    return checked_module(SCHEDULER, again=True)


def seam_problems(module: ModuleType) -> list[str]:
    """What is missing or changed of the seams `SEAMS` lists in ``module`` (empty: all there)."""
    problems: list[str] = []
    for seam in (seam for seam in SEAMS if seam.module == module.__name__):
        problem = _problem(module, seam)
        if problem:
            problems.append(problem)
    return problems


def _problem(module: ModuleType, seam: Seam) -> str | None:
    owner: object = module
    if seam.owner:
        owner = getattr(module, seam.owner, None)
        if owner is None:
            return f"no {seam.owner}"
    if seam.use == "assigned":  # by the class's methods or the module's functions: read the module
        source = inspect.getsource(module)
        assigns = re.search(rf"\.{re.escape(seam.name)}\s*(:[^=\n]*)?=[^=]", source)
        return None if assigns else f"nothing assigns {seam.path}"
    found = inspect.getattr_static(owner, seam.name, None) if seam.owner else getattr(owner, seam.name, None)
    if found is None:
        return f"no {seam.path}"
    if not seam.parameters:
        return None
    if isinstance(found, type) and hasattr(found, "__dataclass_fields__"):
        names = set(found.__dataclass_fields__)
    else:
        function = found.__func__ if isinstance(found, staticmethod | classmethod) else found
        try:
            names = set(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            return f"{seam.path} is not callable"
    missing = sorted(set(seam.parameters) - names)
    return f"{seam.path} lacks {missing}" if missing else None
