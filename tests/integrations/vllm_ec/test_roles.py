"""Roles: an ``ec_consumer`` loads what is there and never writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integrations.vllm_ec.conftest import EngineRunner, ec_config
from tests.integrations.vllm_ec.workload import MAIN
from visioncache.tiers.disk import DiskTier


def test_a_consumer_encodes_what_it_misses_and_saves_nothing(
    stock: dict[str, Any], run_engine: EngineRunner, tmp_path: Path
) -> None:
    directory = tmp_path / "tier"
    report = run_engine("main", ec=ec_config("ec_consumer", disk_dir=str(directory)))
    main = report["workloads"]["main"]
    assert main["failed"] == 0
    assert main["encoded"] == MAIN.distinct
    assert main["outputs"] == stock["workloads"]["main"]["outputs"]
    assert report["connector"]["misses"] == MAIN.distinct + 1  # and the warm-up image
    assert report["connector"].get("saves", 0) == 0
    tier = DiskTier(directory)
    assert [key for key in list(tier.keys()) if "/vllm-ec/" in key] == []
    tier.close()
