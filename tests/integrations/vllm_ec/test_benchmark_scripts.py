"""The vLLM benchmark scripts' cheap parts: arguments, what they hand vLLM's client, reports, faults.

`benchmarks/bench_vllm_serve.py` and `benchmarks/compare_ec_example.py` start real servers and
engines (minutes; not part of `make test-vllm`). Here: their flags resolve as documented, vLLM's
own `vllm bench serve` parser and custom_image dataset accept what they generate, the ratio and
outcome functions say what the numbers say, and the faults change the files they claim to.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest
from benchmarks import _ec_engine, _ec_faults, bench_tier_cost, bench_vllm_serve, compare_ec_example
from benchmarks._vllm_serving import (
    Client,
    client_args,
    custom_image_args,
    random_mm_args,
    write_reuse_dataset,
)


def test_quick_changes_the_defaults_and_an_explicit_flag_wins() -> None:
    full = bench_vllm_serve.parse_args([])
    assert (full.rounds, full.prompts, full.reuse_rounds, full.reuse_requests) == (10, 32, 2, 48)
    quick = bench_vllm_serve.parse_args(["--quick", "--rounds", "3"])
    assert (quick.rounds, quick.prompts, quick.reuse_rounds, quick.reuse_requests) == (3, 16, 1, 24)
    assert quick.image_size == (720, 1280) and quick.concurrency == 4
    assert compare_ec_example.parse_args(["--quick"]).turns == 3
    assert compare_ec_example.parse_args([]).rounds == 2
    for bad in (["--rounds", "0"], ["--image-size", "720"]):
        with pytest.raises(SystemExit):
            bench_vllm_serve.parse_args(bad)


def test_every_variant_runs_first_and_last_equally_often() -> None:
    orders = [bench_vllm_serve.order(index) for index in range(4)]
    assert orders[0] == ["alone", "disk", "redis"] and orders[1] == ["redis", "disk", "alone"]
    for name in bench_vllm_serve.VARIANTS:
        assert sum(o[0] == name for o in orders) == sum(o[-1] == name for o in orders)


def test_vllm_bench_serve_parses_what_the_benchmark_sends(tmp_path: Path) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Server:
        url, model = "http://127.0.0.1:1", str(tmp_path)

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    client = Client(tmp_path, concurrency=4, input_len=64, output_len=16)
    zero = parser.parse_args(
        client_args(client, Server(), random_mm_args(48, 7, (720, 1280)), tmp_path / "r.json")
    )
    assert zero.dataset_name == "random-mm" and zero.num_prompts == 48 and zero.seed == 7
    assert zero.random_mm_bucket_config == {(720, 1280, 1): 1.0}
    assert zero.random_mm_limit_mm_per_prompt == {"image": 1, "video": 0}
    assert zero.ready_check_timeout_sec == 0 and zero.max_concurrency == 4 and zero.ignore_eos
    reuse = parser.parse_args(
        client_args(client, Server(), custom_image_args(tmp_path / "d.jsonl", 6, 16), tmp_path / "r.json")
    )
    assert reuse.dataset_name == "custom_image" and reuse.disable_shuffle and reuse.custom_output_len == 16


def test_the_reuse_dataset_cycles_over_its_images_with_distinct_texts(tmp_path: Path) -> None:
    from vllm.benchmarks.datasets.datasets import CustomImageDataset

    path = write_reuse_dataset(tmp_path / "reuse.jsonl", distinct=2, requests=6, seed=1, image_size=(28, 56))
    dataset = CustomImageDataset(dataset_path=str(path), disable_shuffle=True, random_seed=0)
    requests = dataset.sample(tokenizer=None, num_requests=6, output_len=4)
    images = [request.multi_modal_data["image_url"]["url"] for request in requests]
    assert len(requests) == 6 and images[:2] == images[2:4] == images[4:] and images[0] != images[1]
    assert images[0].startswith("data:image/jpeg;base64,")
    assert len({request.prompt for request in requests}) == 6


def runs(alone: list[float], disk: list[float], redis: list[float]) -> dict[str, list[dict[str, Any]]]:
    def run(ttft: float) -> dict[str, Any]:
        return {"median_ttft_ms": ttft, "mean_ttft_ms": ttft, "request_throughput": 1000 / ttft, "encoded": 4}

    made = {"alone": alone, "disk": disk, "redis": redis}
    return {
        name: [{**run(t), "sent": 4, "failed": 0, "completed": 4} for t in values]
        for name, values in made.items()
    }


def test_the_zero_reuse_report_gives_a_t_interval_of_the_per_round_ratios() -> None:
    table = "\n".join(bench_vllm_serve.zero_reuse_lines(runs([100, 200], [103, 190], [100, 200])))
    logs = [math.log(103 / 100), math.log(190 / 200)]
    half = 12.706 * statistics.stdev(logs) / math.sqrt(2)  # Student's t(0.975, 1 df)
    centre, low, high = (math.exp(statistics.fmean(logs) + d) for d in (0, -half, half))
    assert f"disk   {centre:.3f}x (95% CI {low:.3f}-{high:.3f}; range 0.95-1.03)" in table
    assert "redis  1.000x (95% CI 1.000-1.000; range 1.00-1.00)" in table
    assert "over 2 rounds" in table and "8/8" in table  # items encoded / sent, over both rounds


def test_the_interval_narrows_with_rounds_and_covers_the_mean() -> None:
    few = bench_vllm_serve.interval([0.98, 1.02, 1.00])
    many = bench_vllm_serve.interval([0.98, 1.02, 1.00] * 12)
    assert few[1] < many[1] < many[0] < many[2] < few[2]
    assert abs(many[0] - 1) < 0.001
    assert math.isnan(bench_vllm_serve.interval([1.1])[1])
    assert bench_vllm_serve.t975(30) == 2.042 and abs(bench_vllm_serve.t975(60) - 2.000) < 0.002


def test_the_reuse_report_gives_speedups_over_vllm_alone() -> None:
    table = "\n".join(bench_vllm_serve.reuse_lines(runs([600], [200], [300])))
    assert "disk 3.00x [3.00-3.00]   redis 2.00x [2.00-2.00]" in table  # TTFT and throughput both


REFERENCE = [{"token_ids": [1, 2]}, {"token_ids": [3, 4]}]


@pytest.mark.parametrize(
    ("report", "words"),
    [
        (None, "crash: the engine process died"),
        ({"start_error": "ConfigurationError: bad"}, "fails to start (ConfigurationError)"),
        ({"outputs": REFERENCE, "encoded": 0}, "served from the cache, identical"),
        (
            {"outputs": REFERENCE, "encoded": 3, "connector": {"tier_corrupt": 3}},
            "encoded 3, identical (3 corrupt",
        ),
        ({"outputs": [REFERENCE[0], {"token_ids": [9]}], "encoded": 0}, "WRONG OUTPUT: 1 of 2"),
        (
            {"outputs": [None, REFERENCE[1]], "errors": ["OSError: x"]},
            "1 of 2 requests failed (OSError); the 1",
        ),
        ({"outputs": [None, None], "errors": ["E: x", "E: y"], "probe_error": "E: z"}, "crash: 2 of 2"),
    ],
)
def test_outcome_says_what_happened(report: dict[str, Any] | None, words: str) -> None:
    assert words in _ec_faults.outcome(report, REFERENCE, returncode=-9)


def test_a_run_killed_at_its_timeout_is_a_hang_not_a_crash() -> None:
    assert _ec_faults.outcome(None, REFERENCE, returncode=_ec_faults.HUNG).startswith("hang: ")


def test_faults_change_every_entry_file_of_both_formats(tmp_path: Path) -> None:
    example, tier = tmp_path / "abc" / "encoder_cache.safetensors", tmp_path / "1a" / "2b" / "x.val"
    index = tmp_path / "cache.db"
    for path in (example, tier, index):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(range(256)) * 4)
    assert _ec_faults.corrupt_entries(tmp_path) == 2
    assert example.stat().st_size == 1024 and example.read_bytes() != index.read_bytes()
    assert (
        sum(a != b for a, b in zip(tier.read_bytes(), index.read_bytes(), strict=True))
        == _ec_faults.FLIPPED_BYTES
    )
    assert _ec_faults.truncate_entries(tmp_path) == 2
    assert example.stat().st_size == tier.stat().st_size == 512 and index.stat().st_size == 1024
    assert _ec_faults.directory_bytes(tmp_path) == (2048, 2)


class FakeConnector:
    """Has an entry for "hit" only."""

    def has_cache_item(self, identifier: str) -> bool:
        return identifier == "hit"

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        self.has_cache_item(request.mm_features[index].identifier)


def test_delete_mid_run_deletes_only_once_a_load_was_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(_ec_engine.CONNECTOR_CLASSES, "FakeConnector", __name__)
    monkeypatch.setattr(FakeConnector, "has_cache_item", FakeConnector.has_cache_item)
    monkeypatch.setattr(FakeConnector, "update_state_after_alloc", FakeConnector.update_state_after_alloc)
    entry = tmp_path / "hit" / "encoder_cache.safetensors"
    entry.parent.mkdir()
    entry.write_bytes(b"x")
    _ec_engine.delete_after_alloc("FakeConnector", tmp_path)

    class Feature:
        def __init__(self, identifier: str) -> None:
            self.identifier = identifier

    class Request:
        def __init__(self) -> None:
            self.mm_features = [Feature("miss"), Feature("hit")]

    connector = FakeConnector()
    assert not connector.has_cache_item("miss")
    connector.update_state_after_alloc(Request(), 0)
    assert entry.exists()  # the scheduler encodes a miss: nothing to delete
    assert connector.has_cache_item("hit")
    connector.update_state_after_alloc(Request(), 1)
    assert not entry.exists()


def test_the_tier_cost_benchmark_gives_every_store_back_what_it_saved(tmp_path: Path) -> None:
    """Each store of `bench_tier_cost.py` round-trips the items it times, vLLM's connector included."""
    from visioncache.tiers import DiskTier, TierChain

    example = bench_tier_cost.example_connector_store(str(tmp_path / "example"))
    assert example is not None  # vLLM is installed here: its connector must be driven
    disk = TierChain([DiskTier(tmp_path / "disk")], max_pending_write_bytes=0)
    stores = [bench_tier_cost.visioncache_store("visioncache disk", disk), example]
    medians = bench_tier_cost.measure(stores, tokens=8, items=2)
    assert set(medians) == {"visioncache disk", "ECExampleConnector (disk)"}
    assert all(save > 0 and load > 0 for save, load in medians.values())
    assert len(list((tmp_path / "example").iterdir())) == 2  # one file per item, as vLLM writes them
