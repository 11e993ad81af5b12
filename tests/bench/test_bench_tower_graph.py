"""benchmarks/bench_tower_graph.py runs on CPU (tiny tower): the blocks run from the kept grid inputs
give the eager tower's output exactly, which is what its CUDA graph replays on a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_bench_tower_graph_script_on_cpu(tmp_path: Path) -> None:
    report = tmp_path / "graph.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_tower_graph.py"),
            "--device",
            "cpu",
            "--vision",
            "tiny",
            "--frame-width",
            "224",
            "--repeats",
            "1",
            "--json",
            str(report),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    assert "of an uncached turn" in completed.stdout
    results = json.loads(report.read_text())
    # host-side sequence bounds change nothing: the blocks alone reproduce the tower bit for bit
    assert results["body_matches_eager"] is True
    assert results["graph_matches_eager"] is None  # no CUDA here: nothing captured
    assert results["tokens_per_patch"] == (168 // 14) * (224 // 14)
    assert results["ms"]["tower_8_patches_eager"] > 0
