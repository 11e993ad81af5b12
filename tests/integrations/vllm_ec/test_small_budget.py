"""Small encoder budget: vLLM evicts encoder outputs and re-encodes; the connector loads them back."""

from __future__ import annotations

from pathlib import Path

from tests.integrations.vllm_ec.conftest import EngineRunner, ec_config
from tests.integrations.vllm_ec.workload import BUDGET

SMALL_BUDGET = 64  # max_num_batched_tokens: one 224x224 image per step


def test_connector_brings_encodes_back_to_one_per_distinct_image(
    run_engine: EngineRunner, tmp_path: Path
) -> None:
    # Same vLLM options both times (an EC consumer turns on enable_mm_embeds, which sizes vLLM's
    # encoder cache); the only difference is the connector.
    alone = run_engine("budget", budget=SMALL_BUDGET, mm_embeds=True)["workloads"]["budget"]
    assert alone["encoded"] > BUDGET.distinct  # the scenario is real: vLLM re-encodes evicted images
    connected = run_engine("budget", budget=SMALL_BUDGET, ec=ec_config(disk_dir=str(tmp_path / "tier")))
    budget = connected["workloads"]["budget"]
    assert budget["encoded"] == BUDGET.distinct
    assert budget["failed"] == 0
    assert budget["outputs"] == alone["outputs"]
    # Each re-encode vLLM would have done became a load.
    assert connected["connector"]["hits"] == alone["encoded"] - BUDGET.distinct
