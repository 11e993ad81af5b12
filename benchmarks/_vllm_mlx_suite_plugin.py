"""The pytest plugin `compare_vllm_mlx_suite.py` loads into vllm-mlx 0.6.0's own test suite, in
both runs (``-p _vllm_mlx_suite_plugin``, ``benchmarks/`` on the path: not the repository root,
whose ``tests`` would shadow vllm-mlx's), so the two differ only in visioncache:

- with ``VLLM_MLX_SUITE_VISIONCACHE=1``, visioncache is installed into vllm-mlx before any test
  runs (`visioncache.integrations.vllm_mlx.install`, as an embedding application does) and
  uninstalled at the end;
- every test's outcome is written to ``VLLM_MLX_SUITE_RECORD`` (JSON lines: node id, outcome);
- a test module that calls ``sys.exit`` at import (vllm-mlx's Apple-Silicon scripts do) becomes
  that module's collection error instead of ending the whole session;
- ``tests._mlx_stub``, which some test files import and the sdist omits, is provided as what it
  is upstream where mlx is installed (as here): ``install_if_unavailable()`` doing nothing.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

RECORD_VARIABLE = "VLLM_MLX_SUITE_RECORD"
VISIONCACHE_VARIABLE = "VLLM_MLX_SUITE_VISIONCACHE"
_installation: list[Any] = []


class _ExitGuardModule(pytest.Module):
    """A test module whose ``sys.exit`` at import is its own collection error."""

    def _getobj(self) -> Any:
        try:
            return super()._getobj()
        except SystemExit as exit:
            raise self.CollectError(f"{self.path.name} calls sys.exit({exit.code!r}) at import") from None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    return _ExitGuardModule.from_parent(parent, path=module_path)


def _provide_mlx_stub() -> None:
    import mlx.core  # noqa: F401 - upstream's stub stubs nothing where this imports

    stub = types.ModuleType("tests._mlx_stub", "vllm-mlx's tests/_mlx_stub.py where mlx is installed")
    stub.install_if_unavailable = lambda: None  # type: ignore[attr-defined]
    sys.modules.setdefault("tests._mlx_stub", stub)


def pytest_configure(config: pytest.Config) -> None:
    _provide_mlx_stub()
    if os.environ.get(VISIONCACHE_VARIABLE) == "1" and not _installation:
        from visioncache.integrations.vllm_mlx import install

        _installation.append(install(model_id="vllm-mlx-own-suite"))


def pytest_unconfigure(config: pytest.Config) -> None:
    while _installation:
        _installation.pop().uninstall()


def _record(nodeid: str, outcome: str) -> None:
    path = os.environ.get(RECORD_VARIABLE)
    if path:
        with open(path, "a") as record:
            record.write(json.dumps({"test": nodeid, "outcome": outcome}) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or (report.when != "call" and not report.passed):
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.when == "call" or report.skipped:
            outcome = report.outcome
        else:
            outcome = f"error ({report.when})"
        _record(report.nodeid, outcome)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _record(report.nodeid, "error (collection)")
