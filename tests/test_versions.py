"""The one version gate every engine integration checks its releases with."""

from __future__ import annotations

import warnings

import pytest
from packaging.version import Version

from visioncache.errors import ConfigurationError, MissingExtraError
from visioncache.versions import UnsupportedVersionError, UntestedVersionWarning, require_version


def test_a_supported_release_comes_back_parsed() -> None:
    assert require_version("pkg", "==1.2.*", needed_by="it", installed="1.2.3+cpu") == Version("1.2.3+cpu")
    assert require_version("pkg", ["==1.2.*", "==1.3.*"], needed_by="it", installed="1.3.0")


@pytest.mark.parametrize("installed", ["1.1.9", "1.4.0", "1.3.0rc1", "1.2.0.dev3", "not a version"])
def test_another_release_is_refused_with_what_is_supported_and_what_was_found(installed: str) -> None:
    with pytest.raises(UnsupportedVersionError) as raised:
        require_version(
            "pkg", ["==1.2.*", "==1.3.*"], needed_by="the thing", installed=installed, why="because"
        )
    message = str(raised.value)
    assert message.startswith("the thing supports pkg ==1.2.* or ==1.3.*")
    assert f"but {installed} is installed: because" in message and "pip install 'pkg==1.3.*'" in message
    assert isinstance(raised.value, ConfigurationError) and isinstance(raised.value, ImportError)


def test_a_release_newer_than_every_tested_one_warns() -> None:
    with pytest.warns(UntestedVersionWarning, match="pkg 1.9.0 is newer than"):
        require_version("pkg", ">=1.0,<2", needed_by="it", installed="1.9.0", tested=("1.0.1", "1.2.0"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        require_version("pkg", ">=1.0,<2", needed_by="it", installed="1.2.0", tested=("1.0.1", "1.2.0"))


def test_a_missing_package_names_the_extra_that_installs_it() -> None:
    with pytest.raises(MissingExtraError, match=r"pip install 'visioncache\[mlx\]'"):
        require_version("no-such-distribution-here", "==1.0", needed_by="it", extra="mlx")
    with pytest.raises(UnsupportedVersionError, match="not installed"):
        require_version("no-such-distribution-here", "==1.0", needed_by="it")
