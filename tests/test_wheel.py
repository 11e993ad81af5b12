"""The built wheel carries the library and its CLI only: no test harness, no benchmark, no test."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.optional import optional

ROOT = Path(__file__).resolve().parents[1]


def source_files() -> list[str]:
    """What a fresh clone has: the files git tracks, plus new ones it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return [name for name in listed.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


@pytest.mark.slow
def test_the_wheel_holds_the_library_and_its_cli_only(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is needed to list the sources")
    setuptools = optional("setuptools")
    if setuptools is None or int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("building offline needs the build requirement here: pip install 'setuptools>=77'")
    tree = tmp_path / "source"
    for name in source_files():  # a copy: building writes build/ and *.egg-info next to the sources
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    offline = ["--no-deps", "--no-build-isolation", "--no-index", "--disable-pip-version-check", "-q"]
    command = [sys.executable, "-m", "pip", "wheel", *offline, "-w", str(tmp_path / "dist"), str(tree)]
    built = subprocess.run(command, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("visioncache-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {
        "visioncache",
        wheel.name.split("-py")[0] + ".dist-info",
    }
    modules = {name for name in names if name.endswith(".py")}
    assert "visioncache/cli.py" in modules and "visioncache/tiers/settings.py" in modules
    support = {path.name for path in (ROOT / "tests" / "support").glob("*.py") if path.name != "__init__.py"}
    assert support and not {Path(name).name for name in modules} & support
    assert not [name for name in modules if "/test" in name or "conftest" in name]
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt")))
    assert b"visioncache = visioncache.cli:main" in entry_points
