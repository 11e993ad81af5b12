"""``visioncache bench --family NAME``: every described family's modes side by side, the
``visioncache`` mode encoding fewer images than ``off`` with the same logits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")
pytest.importorskip("skimage")

from tests.integrations.family_reference import build_or_skip
from visioncache.bench.family_models import FAMILY_MODELS, build_family_model
from visioncache.bench.towers import VISION_TOWERS
from visioncache.bench.transformers_runner import run_modes
from visioncache.bench.workload import build_workload
from visioncache.errors import ConfigurationError

pytestmark = pytest.mark.slow


def quietly(items: Any, _description: str) -> Any:
    return items


def test_every_family_the_bench_names_has_an_offline_model() -> None:
    assert set(FAMILY_MODELS) == set(VISION_TOWERS)


@pytest.mark.parametrize("family", FAMILY_MODELS)
def test_each_family_runs_every_mode_with_off_s_logits(family: str) -> None:
    built = build_or_skip(family)
    workload = build_workload(users=2, turns=3, image_size=64, generated_images=1)
    results, max_diff = run_modes(built.model, built.processor, workload, quietly, built.placeholder)
    modes = {result.mode: result for result in results}
    assert max_diff <= 1e-4
    assert modes["off"].images_encoded == modes["off"].images_sent > 0
    assert modes["visioncache"].images_encoded < modes["prompt_keyed"].images_encoded
    assert modes["off"].encode_s > 0 and modes["visioncache"].encode_s > 0  # the tower's clock ran


def test_bench_family_end_to_end(tmp_path: Path) -> None:
    report_path = tmp_path / "gemma3.json"
    command = [sys.executable, "-m", "visioncache", "bench", "--family", "gemma3", "--quick", "--no-progress"]
    completed = subprocess.run(
        [*command, "--json", str(report_path)], capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(report_path.read_text())
    assert report["settings"]["family"] == "gemma3"
    assert report["max_abs_logit_diff"] <= report["logit_tolerance"]
    assert "random-weight gemma3" in completed.stdout and "images encoded" in completed.stdout


def test_a_tower_size_the_family_does_not_have_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="--vision full is not defined for smolvlm"):
        build_family_model("smolvlm", "full")
