"""The one version gate: every engine integration checks the releases it supports here.

Why one gate: an integration relies on another project's code that changes between releases
(vllm-mlx's methods, mlx-vlm's model code, vLLM's connector interface, transformers' processor
seam), so each states the releases it supports as a specifier set, and anything outside is
refused before the integration touches the package — with one error type, one message shape
(what needs it, what is supported, what was found, the pip install that fixes it) and one rule
for releases newer than any tested one within a supported range (a warning).

`UnsupportedVersionError` subclasses both `ConfigurationError` (a setting of the environment is
wrong) and `ImportError` (raised while importing the integration), so callers may catch either.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from visioncache.errors import ConfigurationError
from visioncache.extras import missing_extra

__all__ = ["UnsupportedVersionError", "UntestedVersionWarning", "require_version"]


class UnsupportedVersionError(ConfigurationError, ImportError):
    """An installed package is outside the releases an integration supports."""


class UntestedVersionWarning(UserWarning):
    """A package is within a supported range but newer than every release it was tested on."""


def require_version(
    package: str,
    supported: str | Sequence[str],
    *,
    needed_by: str,
    installed: str | None = None,
    tested: Sequence[str] = (),
    why: str = "",
    extra: str | None = None,
) -> Version:
    """The installed ``package``'s version, if one of the ``supported`` specifier sets (PEP 440:
    ``"==0.6.0"``, ``">=5.20,<6"``, ``"==0.32.*"``) contains it; pre-releases never do.

    Args:
        package: the distribution's name, as pip spells it (``"vllm-mlx"``).
        supported: one specifier set, or several (any of them).
        needed_by: what needs it, for the message (``"visioncache's vllm-mlx integration"``).
        installed: the version to check instead of the installed distribution's (tests).
        tested: the releases the integration's tests ran on; a supported release newer than all
            of them warns (`UntestedVersionWarning`).
        why: why other releases are refused, for the message.
        extra: the ``visioncache[extra]`` that installs ``package``, for a missing one.

    Returns:
        The parsed version.

    Raises:
        UnsupportedVersionError: another release (or an unreadable version) is installed.
        MissingExtraError: ``package`` is not installed and ``extra`` names what installs it.
    """
    sets = [supported] if isinstance(supported, str) else list(supported)
    shown = " or ".join(sets)
    if installed is None:
        try:
            installed = metadata.version(package)
        except metadata.PackageNotFoundError:
            if extra is not None:
                raise missing_extra(extra, needed_by, package, f"{package}{sets[0]}") from None
            raise UnsupportedVersionError(
                f"{needed_by} needs {package}{shown}, which is not installed"
            ) from None
    try:
        version = Version(installed)
    except InvalidVersion:
        version = None
    final = version is not None and not (version.is_prerelease or version.is_devrelease)
    if version is None or not final or not any(SpecifierSet(spec).contains(version) for spec in sets):
        detail = f" (tested: {', '.join(tested)})" if tested else ""
        reason = f": {why}" if why else ""
        raise UnsupportedVersionError(
            f"{needed_by} supports {package} {shown}{detail}, but {installed} is installed{reason}; "
            f"pip install '{package}{sets[-1]}'"
        )
    newest = max((Version(item) for item in tested), default=None)
    if newest is not None and version.release > newest.release:
        warnings.warn(
            f"{package} {installed} is newer than the releases {needed_by} was tested on "
            f"({', '.join(tested)})",
            UntestedVersionWarning,
            stacklevel=2,
        )
    return version
