"""``benchmarks/compare_vllm_mlx_suite.py`` on a stand-in suite: the two runs differ only in
visioncache being installed, every outcome is recorded, a module's ``sys.exit`` at import stays
its own error, and a test whose outcome differs is reported (the script's exit status says so).
The real run (vllm-mlx 0.6.0's sdist) takes minutes and the network: docs/vllm-mlx.md quotes it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm_mlx", reason="vllm-mlx is not installed (pip install 'visioncache[vllm-mlx]')")

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import compare_vllm_mlx_suite as comparison

pytestmark = pytest.mark.slow

STAND_IN = """
from visioncache.integrations import vllm_mlx


def test_passes_in_both():
    assert True


def test_passes_only_stock():
    assert vllm_mlx.installed() is None


def test_skipped_in_both():
    import pytest

    pytest.skip("no GPU here")
"""


def test_outcomes_are_compared_per_test_and_a_difference_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tests = tmp_path / f"vllm_mlx-{comparison.VERSION}" / "tests"  # an unpacked "sdist": not downloaded
    tests.mkdir(parents=True)
    (tests / "test_stand_in.py").write_text(STAND_IN)
    (tests / "test_exits_at_import.py").write_text("import sys\nsys.exit(0)\n")
    assert comparison.main(["--work-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS tests/test_stand_in.py::test_passes_only_stock: stock passed, visioncache failed" in out
    assert "1 test(s) with another outcome" in out
    for run in comparison.RUNS:
        records = map(json.loads, (tmp_path / f"{run}.jsonl").read_text().splitlines())
        outcomes = {record["test"]: record["outcome"] for record in records}
        assert outcomes["tests/test_stand_in.py::test_passes_in_both"] == "passed"
        assert outcomes["tests/test_stand_in.py::test_skipped_in_both"] == "skipped"
        assert outcomes["tests/test_exits_at_import.py"] == "error (collection)"  # the session went on
