"""``visioncache bench --video``: the workloads' traffic shape, the report, the measured reuse."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("av")

from visioncache import compute_image_hash
from visioncache.bench.video_report import later_turns, mode_rows
from visioncache.bench.video_runner import TurnResult, VideoModeResult
from visioncache.bench.video_workload import STRIDE, WINDOW, build_video_workloads
from visioncache.bench.vocabulary import VIDEO_PLACEHOLDER
from visioncache.integrations.video.clip import VideoFrames, VideoSettings, rgb_frame


@pytest.fixture(scope="module")
def workloads() -> dict[str, Any]:
    return {w.name: w for w in build_video_workloads(3, 56, VideoSettings(fps=2.0))}


def test_resend_sends_the_same_file_every_turn_in_a_growing_chat(workloads: dict[str, Any]) -> None:
    requests = workloads["resend"].requests
    assert all(isinstance(r.video, bytes) and r.video == requests[0].video for r in requests)
    assert [r.frames for r in requests] == [WINDOW] * 3
    assert len({r.prompt for r in requests}) == 3  # the prompt grows, the video stays
    assert all(r.prompt.count(VIDEO_PLACEHOLDER) == 1 for r in requests)


def test_sliding_windows_overlap_by_all_but_the_stride(workloads: dict[str, Any]) -> None:
    windows = [r.video for r in workloads["sliding"].requests]
    assert all(isinstance(w, VideoFrames) and len(w.frames) == WINDOW for w in windows)
    for before, after in itertools.pairwise(windows):
        digests = [[compute_image_hash(rgb_frame(f)) for f in w.frames] for w in (before, after)]
        assert digests[0][STRIDE:] == digests[1][: WINDOW - STRIDE]
        assert not set(digests[1][WINDOW - STRIDE :]) & set(digests[0])  # the new frames are new
        assert list(after.frame_indices) == [i + STRIDE for i in before.frame_indices]


def test_resample_changes_the_sampling_rate_each_turn(workloads: dict[str, Any]) -> None:
    requests = workloads["resample"].requests
    assert [r.frames for r in requests] == [16, 24, 8]  # 2, 3 and 1 fps of a 4 fps clip
    assert len({tuple(r.video.frame_indices) for r in requests}) == 3


def _result(mode: str, encoded: list[int], vision: list[float]) -> VideoModeResult:
    turns = [TurnResult(8, e, v, v + 0.5, 0.0) for e, v in zip(encoded, vision, strict=True)]
    return VideoModeResult(mode, "sliding", turns)


def test_report_ratios_cover_turns_from_the_second_on() -> None:
    off = _result("off", [8, 8, 8], [4.0, 4.0, 4.0])
    cached = _result("visioncache", [8, 1, 1], [4.0, 0.5, 0.5])
    assert later_turns(cached) == {"patches_encoded": 2, "patches_sent": 16, "vision_s": 1.0, "ttft_s": 2.0}
    rows = {row[0]: row[1:] for row in mode_rows([off, cached])}
    assert rows["turns >= 2: encoded / sent"] == ["16 / 16", "2 / 16"]
    assert rows["turns >= 2: vision vs off"] == ["100.0%", "12.5%"]


@pytest.mark.slow
def test_quick_video_bench_reuses_only_what_is_shared(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    report = tmp_path / "video.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "visioncache",
            "bench",
            "--video",
            "--quick",
            "--no-progress",
            "--json",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(report.read_text())
    assert result["outputs_match"] and result["max_abs_logit_diff"] <= 1e-4
    encoded = {
        (name, mode): [turn["patches_encoded"] for turn in run["turns"]]
        for name, workload in result["workloads"].items()
        for mode, run in workload["modes"].items()
    }
    assert encoded["sliding", "visioncache"] == [8, 1, 1]  # only the new temporal patch
    assert encoded["sliding", "whole_clip"] == [8, 8, 8]  # any change misses the whole clip
    assert encoded["resend", "visioncache"] == encoded["resend", "whole_clip"] == [8, 0, 0]
    assert encoded["resample", "visioncache"] == [8, 12, 4]  # no patch shared: nothing reused
    assert encoded["sliding", "off"] == [8, 8, 8]


def test_video_on_the_mlx_engine_is_a_clear_error() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "visioncache", "bench", "--video", "--engine", "mlx"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 2
    assert "--video runs on the transformers engine only" in completed.stderr
