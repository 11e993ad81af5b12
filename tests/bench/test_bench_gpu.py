"""benchmarks/bench_gpu.py and bench_tower_graph.py run on CPU (tiny tower) and report consistent
figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).parents[2]


def run_script(script: str, tmp_path: Path, *arguments: str) -> tuple[str, Any]:
    """The script's stdout and its --json report, on CPU with the tiny tower, one repeat."""
    report = tmp_path / "report.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / script),
            *("--device", "cpu", "--vision", "tiny", "--repeats", "1", "--json", str(report)),
            *arguments,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return completed.stdout, json.loads(report.read_text())


@pytest.mark.slow
def test_bench_gpu_script_on_cpu(tmp_path: Path) -> None:
    stdout, results = run_script("bench_gpu.py", tmp_path, "--counts", "2")
    assert "(pre+enc)/hit" in stdout
    row = results["counts"]["2"]
    assert row["tokens_per_image"] == 999  # 1024x768 -> 36x28 merged patches after resizing
    assert row["bytes_per_image"] == 999 * 64 * 4  # tiny tower: 64 float32 features per token
    # a hit (hash + lookup) is far cheaper than encoding, whatever the machine's speed
    assert row["ratio_encode_over_hit_host"] > 10
    assert row["hit_device_gpu_work"] == 0 and row["hash_floor_ms_per_image"] > 0


@pytest.mark.slow
def test_bench_tower_graph_script_on_cpu(tmp_path: Path) -> None:
    """The blocks run from the kept grid inputs give the eager tower's output exactly, which is
    what the script's CUDA graph replays on a GPU."""
    stdout, results = run_script("bench_tower_graph.py", tmp_path, "--frame-width", "224")
    assert "of an uncached turn" in stdout
    # host-side sequence bounds change nothing: the blocks alone reproduce the tower bit for bit
    assert results["body_matches_eager"] is True
    assert results["graph_matches_eager"] is None  # no CUDA here: nothing captured
    assert results["tokens_per_patch"] == (168 // 14) * (224 // 14)
    assert results["ms"]["tower_8_patches_eager"] > 0
