"""Two versions of visioncache in one process: this tree's and a git revision's, for benchmarks
that compare them side by side (bench_hit_path.py, bench_writes.py)."""

from __future__ import annotations

import importlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def import_visioncache(source: Path | None) -> ModuleType:
    """``visioncache`` from ``source`` (a folder holding the package), or this tree's; the modules
    are then moved out of ``sys.modules`` so that the other version can be imported too."""
    for name in [name for name in sys.modules if name == "visioncache" or name.startswith("visioncache.")]:
        del sys.modules[name]
    path = str(source if source is not None else ROOT / "src")
    sys.path.insert(0, path)
    try:
        package = importlib.import_module("visioncache")
        importlib.import_module("visioncache.cache")
    finally:
        sys.path.remove(path)
    loaded = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "visioncache"}
    for name in loaded:
        del sys.modules[name]
    assert Path(package.__file__ or "").is_relative_to(path), package.__file__
    return package


def extract(revision: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "src/visioncache"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"
