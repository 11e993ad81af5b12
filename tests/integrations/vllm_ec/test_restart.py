"""Restart: a second server on the same disk tier encodes nothing and answers identically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integrations.vllm_ec.conftest import EngineRunner, copy_tier, ec_config
from tests.integrations.vllm_ec.workload import MAIN

DISTINCT = MAIN.distinct + 1  # the workload's images and the warm-up image


def test_stock_vllm_encodes_each_distinct_image_once(stock: dict[str, Any]) -> None:
    # The baseline the connector is compared with: within one live engine vLLM itself encodes
    # each of the 5 distinct images once, although the workload sends 42 images.
    main = stock["workloads"]["main"]
    assert MAIN.images_sent == 42
    assert main["encoded"] == MAIN.distinct
    assert main["failed"] == 0


def test_cold_run_with_connector_matches_vllm_alone(
    stock: dict[str, Any], populated_disk: dict[str, Any]
) -> None:
    cold = populated_disk["report"]
    main = cold["workloads"]["main"]
    assert main["outputs"] == stock["workloads"]["main"]["outputs"]  # tokens and top-5 logprobs
    assert main["encoded"] == MAIN.distinct
    # Every encoded item (the warm-up image too) was handed to the writer, none dropped.
    assert cold["connector"]["saves"] == DISTINCT
    assert cold["connector"].get("saves_dropped", 0) == 0


def test_restart_on_the_same_disk_tier_encodes_nothing(
    stock: dict[str, Any], populated_disk: dict[str, Any], run_engine: EngineRunner, tmp_path: Path
) -> None:
    directory = copy_tier(populated_disk["directory"], tmp_path)
    warm = run_engine("main", ec=ec_config(disk_dir=str(directory)))
    main = warm["workloads"]["main"]
    assert main["encoded"] == 0
    assert main["failed"] == 0
    assert main["outputs"] == stock["workloads"]["main"]["outputs"]
    assert warm["connector"]["hits"] == DISTINCT
    assert warm["connector"].get("misses", 0) == 0
    # The same counts through visioncache's Prometheus collector (in-process engine).
    metrics = warm["metrics"]
    assert metrics['visioncache_cache_hits_total{level="vllm-ec"}'] == DISTINCT
    assert metrics['visioncache_tier_hits_total{tier="disk"}'] == DISTINCT
    assert metrics['visioncache_time_saved_seconds_total{level="vllm-ec"}'] > 0
