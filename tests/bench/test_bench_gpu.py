"""benchmarks/bench_gpu.py runs on CPU (tiny tower) and reports consistent per-image figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_bench_gpu_script_on_cpu(tmp_path: Path) -> None:
    report = tmp_path / "gpu.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_gpu.py"),
            "--device",
            "cpu",
            "--vision",
            "tiny",
            "--counts",
            "2",
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
    assert "(pre+enc)/hit" in completed.stdout
    row = json.loads(report.read_text())["counts"]["2"]
    assert row["tokens_per_image"] == 999  # 1024x768 -> 36x28 merged patches after resizing
    assert row["bytes_per_image"] == 999 * 64 * 4  # tiny tower: 64 float32 features per token
    # a hit (hash + lookup) is far cheaper than encoding, whatever the machine's speed
    assert row["ratio_encode_over_hit_host"] > 10
