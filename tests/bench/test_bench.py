"""``visioncache bench``: the workload's traffic shape, the report's arithmetic, the command's exits."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("skimage")

from visioncache.bench.report import (
    ModeResult,
    format_seconds,
    format_table,
    image_cost_ratios,
    report_json,
)
from visioncache.bench.workload import MODES, build_workload, chat_prompt
from visioncache.stats import CacheStats
from visioncache.store.store import StoreStats


@pytest.fixture(scope="module")
def workload() -> Any:
    return build_workload(users=3, turns=4, image_size=64, generated_images=2)


def test_workload_is_deterministic(workload: Any) -> None:
    assert build_workload(users=3, turns=4, image_size=64, generated_images=2) == workload
    assert build_workload(users=3, turns=4, image_size=64, generated_images=2, seed=1) != workload


def test_each_turn_resends_the_conversations_images(workload: Any) -> None:
    previous: dict[int, tuple[int, ...]] = {}
    for request in workload.requests:
        earlier = previous.get(request.user, ())
        assert request.image_indexes[: len(earlier)] == earlier
        previous[request.user] = request.image_indexes
    assert len(workload.requests) == 12
    assert [len(r.turns) for r in workload.requests] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]


def test_images_are_shared_across_users_and_asked_with_different_questions(workload: Any) -> None:
    users_per_image: dict[int, set[int]] = {}
    questions_per_image: dict[int, set[str]] = {}
    for request in workload.requests:
        for turn in request.turns:
            for index in turn.image_indexes:
                users_per_image.setdefault(index, set()).add(request.user)
        for index in request.image_indexes:
            questions_per_image.setdefault(index, set()).add(request.turns[-1].question)
    assert any(len(users) > 1 for users in users_per_image.values())
    assert all(len(questions) > 1 for questions in questions_per_image.values())


def test_images_are_real_photos_and_generated_data_urls(workload: Any) -> None:
    assert workload.image_names[:4] == ("grace_hopper", "astronaut", "coffee", "chelsea")
    assert workload.image_names[4:] == ("generated_0", "generated_1")
    assert all(url.startswith("data:image/jpeg;base64,") for url in workload.images)
    assert len(set(workload.images)) == len(workload.images)


def test_repeated_only_marks_requests_that_send_no_new_image(workload: Any) -> None:
    flags = workload.repeated_only()
    assert flags[:3] == [False, False, False]  # first turns bring new photos
    assert flags[3:6] == [True, True, True]  # second turns only resend them
    assert workload.images_sent == sum(len(r.image_indexes) for r in workload.requests)
    assert workload.distinct_images_sent == 5  # three users open with photos 0-2; + 2 generated


def test_chat_prompt_has_one_placeholder_per_image_and_ends_with_the_assistant(workload: Any) -> None:
    for request in workload.requests:
        text = chat_prompt(request, "<IMG>")
        assert text.count("<IMG>") == len(request.image_indexes)
        assert text.count("<|im_start|>user") == len(request.turns)
        assert text.endswith("<|im_start|>assistant\n")


def test_build_workload_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="users"):
        build_workload(users=0)


def mode(name: str, image_s: list[float], **fields: Any) -> ModeResult:
    return ModeResult(
        name,
        image_s=image_s,
        prefill_s=[s + 0.1 for s in image_s],
        images_per_request=[2] * len(image_s),
        **fields,
    )


def test_cost_per_repeated_image_counts_only_requests_that_resend() -> None:
    repeated = [False, True, True]
    off = mode("off", [4.0, 4.0, 8.0])
    cached = mode("visioncache", [4.0, 0.001, 0.003])
    assert off.seconds_per_repeated_image(repeated) == pytest.approx(3.0)
    assert cached.seconds_per_repeated_image(repeated) == pytest.approx(0.001)
    assert image_cost_ratios([off, cached], repeated) == {"off": pytest.approx(3000.0)}


def test_prefill_percentiles_and_json_report() -> None:
    result = mode(
        "visioncache",
        [0.0] * 20,
        stats=CacheStats(
            levels={
                "pixel": StoreStats(bytes=10),
                "pixel_only": StoreStats(),
                "encoding": StoreStats(),
                "embedding": StoreStats(hits=3, misses=1, bytes=5, device_bytes=4, spills=2),
            }
        ),
    )
    result.prefill_s = [float(i) for i in range(1, 21)]
    assert result.prefill_percentile(50) == pytest.approx(10.5)
    assert result.prefill_percentile(95) == pytest.approx(19.05)
    report = report_json([result], [False] * 20, 0.0, 1e-4, {"users": 1})
    fields = report["modes"]["visioncache"]
    assert {"wall_s", "preprocess_s", "encode_s", "images_encoded", "requests"} <= set(fields)
    assert (fields["embedding_hit_rate"], fields["requests"], fields["bytes_cached"]) == (0.75, 20, 15)
    assert (fields["device_bytes_cached"], fields["spills"]) == (4, 2)
    assert report["max_abs_logit_diff"] == 0.0 and report["outputs_match"]


def test_table_has_one_column_per_mode_and_readable_units() -> None:
    rows = format_table([mode("off", [1.5]), mode("visioncache", [2e-5])], [True])
    assert rows[0] == ["", "off", "visioncache"]
    assert dict((row[0], row[1:]) for row in rows)["per repeated image"] == ["750.00 ms", "10 µs"]
    assert [format_seconds(s) for s in (2.0, 0.0125, 3e-6)] == ["2.00 s", "12.50 ms", "3 µs"]


def bench_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    from visioncache.commands import bench

    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    return parser.parse_args(
        [
            "bench",
            "--quick",
            "--no-progress",
            "--json",
            str(tmp_path / "report.json"),
            "--plot",
            str(tmp_path / "chart.png"),
            *extra,
        ]
    )


@pytest.mark.slow
def test_bench_exits_nonzero_when_logits_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from visioncache.bench import transformers_runner
    from visioncache.commands import bench

    def run_modes(model: Any, processor: Any, workload: Any, *args: Any, **options: Any) -> Any:
        requests = len(workload.requests)
        return [mode(name, [0.5] * requests, wall_s=2.0) for name in MODES], 0.25

    monkeypatch.setattr(transformers_runner, "run_modes", run_modes)
    assert bench.run(bench_args(tmp_path)) == 1
    assert json.loads((tmp_path / "report.json").read_text())["outputs_match"] is False
    assert bench.run(bench_args(tmp_path, "--tolerance", "0.5")) == 0
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "visioncache", "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_bad_model_path_is_a_clear_error_with_exit_code_2(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    completed = run_cli("--model", str(tmp_path / "missing"))
    assert completed.returncode == 2
    assert "no config.json" in completed.stderr
    assert "Traceback" not in completed.stderr


@pytest.mark.slow
def test_quick_bench_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    completed = run_cli(
        "--quick",
        "--no-progress",
        "--json",
        str(tmp_path / "report.json"),
        "--plot",
        str(tmp_path / "chart.png"),
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    modes = report["modes"]
    assert report["max_abs_logit_diff"] <= report["logit_tolerance"]
    assert modes["off"]["images_encoded"] == modes["off"]["images_sent"]
    assert modes["visioncache"]["images_encoded"] < modes["prompt_keyed"]["images_encoded"]
    assert modes["visioncache"]["embedding_hit_rate"] > 0.5
    assert all(m["requests"] == modes["off"]["requests"] for m in modes.values())
    assert "max |logit difference| between modes: " in completed.stdout
    assert (tmp_path / "chart.png").stat().st_size > 10_000


def test_missing_hf_extra_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from visioncache.commands import bench
    from visioncache.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` meets without the extra
    with pytest.raises(MissingExtraError, match=r"pip install 'visioncache\[hf\]'"):
        bench.run(bench_args(tmp_path))


@pytest.mark.slow
def test_quick_bench_on_the_mlx_engine(tmp_path: Path) -> None:
    pytest.importorskip("mlx_vlm", reason="mlx-vlm cannot be installed on this platform")
    completed = run_cli("--quick", "--no-progress", "--engine", "mlx", "--json", str(tmp_path / "mlx.json"))
    assert completed.returncode == 0, completed.stderr
    report = json.loads((tmp_path / "mlx.json").read_text())
    modes = report["modes"]
    assert report["settings"]["engine"] == "mlx" and report["max_abs_logit_diff"] == 0.0
    assert modes["off"]["images_encoded"] == modes["off"]["images_sent"]
    assert modes["visioncache"]["images_encoded"] < modes["off"]["images_encoded"]
    assert modes["visioncache"]["embedding_hit_rate"] > 0.5


def test_unusable_device_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from visioncache.commands import bench
    from visioncache.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="cannot use --device no-such-device"):
        bench.run(bench_args(tmp_path, "--device", "no-such-device"))


def test_model_path_is_refused_with_the_mlx_engine(tmp_path: Path) -> None:
    from visioncache.commands import bench
    from visioncache.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="--model is not supported with --engine mlx"):
        bench.run(bench_args(tmp_path, "--engine", "mlx", "--model", str(tmp_path)))


@pytest.mark.slow
def test_bench_runs_on_a_local_checkpoint_directory(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from visioncache.bench import models

    model, processor = models.build_offline_model("qwen2_5_vl", "tiny", torch.float32)
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    processor.save_pretrained(checkpoint)
    completed = run_cli(
        "--quick", "--no-progress", "--model", str(checkpoint), "--json", str(tmp_path / "r.json")
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["model"] == str(checkpoint) and report["outputs_match"]
    assert report["modes"]["visioncache"]["images_encoded"] < report["modes"]["off"]["images_encoded"]


def test_checkpoint_of_an_unsupported_family_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from visioncache.bench import models
    from visioncache.errors import ConfigurationError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigurationError, match="'llama' model; supported"):
        models.load_model(tmp_path)
