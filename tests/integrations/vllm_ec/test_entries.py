"""Corrupt and foreign entries are recomputed, never served (and never fail a request)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integrations.vllm_ec.conftest import EngineRunner, copy_tier, ec_config
from tests.integrations.vllm_ec.workload import MAIN
from visioncache.identity.keys import KeyBuilder
from visioncache.tiers.disk import DiskTier

DISTINCT = MAIN.distinct + 1  # the workload's images and the warm-up image


def _entry_keys(tier: DiskTier) -> list[str]:
    stored = list(tier.keys())
    return [key for key in stored if "/vllm-ec/" in key]


def _assert_recomputed(report: dict[str, Any], stock: dict[str, Any]) -> None:
    main = report["workloads"]["main"]
    assert main["failed"] == 0
    assert main["encoded"] == MAIN.distinct  # every item encoded again
    assert main["outputs"] == stock["workloads"]["main"]["outputs"]
    assert report["connector"].get("hits", 0) == 0


def test_corrupt_entries_are_recomputed_and_deleted(
    stock: dict[str, Any], populated_disk: dict[str, Any], run_engine: EngineRunner, tmp_path: Path
) -> None:
    directory = copy_tier(populated_disk["directory"], tmp_path)
    tier = DiskTier(directory)
    keys = _entry_keys(tier)
    assert len(keys) == DISTINCT
    for key in keys:  # flip one byte in the middle of each stored tensor
        blob = bytearray(tier.get(key) or b"")
        blob[len(blob) // 2] ^= 0xFF
        tier.put(key, bytes(blob))
    tier.close()
    report = run_engine("main", ec=ec_config(disk_dir=str(directory)))
    _assert_recomputed(report, stock)
    assert report["connector"]["tier_corrupt"] == DISTINCT


def test_entries_of_another_namespace_are_not_served_even_under_this_namespace_key(
    stock: dict[str, Any], populated_disk: dict[str, Any], run_engine: EngineRunner, tmp_path: Path
) -> None:
    # Another deployment's entries copied to exactly the keys this deployment reads: the blob is
    # bound to the key it was written under, so it reads as corrupt, not as a value.
    directory = copy_tier(populated_disk["directory"], tmp_path)
    tier = DiskTier(directory)
    keys = _entry_keys(tier)
    theirs = keys[0].split("/", 1)[0]
    ours = KeyBuilder("operator-chosen/v1").tag
    for key in keys:
        tier.put(ours + key[len(theirs) :], tier.get(key) or b"")
    tier.close()
    report = run_engine("main", ec=ec_config(disk_dir=str(directory), namespace="operator-chosen/v1"))
    _assert_recomputed(report, stock)
    assert report["connector"]["tier_corrupt"] == DISTINCT


def test_entries_signed_with_another_secret_are_recomputed(
    stock: dict[str, Any], populated_disk: dict[str, Any], run_engine: EngineRunner, tmp_path: Path
) -> None:
    directory = copy_tier(populated_disk["directory"], tmp_path)
    # Unsigned entries are not served to a server that requires signatures...
    signed = run_engine(
        "main",
        ec=ec_config(disk_dir=str(directory), hmac_secret_env="VC_SECRET"),
        env={"VC_SECRET": "secret-one"},
    )
    _assert_recomputed(signed, stock)
    # ...and what that server signed is not served to one holding another secret.
    other = run_engine(
        "main",
        ec=ec_config(disk_dir=str(directory), hmac_secret_env="VC_SECRET"),
        env={"VC_SECRET": "secret-two"},
    )
    _assert_recomputed(other, stock)
    # The same secret reads them back: the entries were there, only unverifiable to the others.
    same = run_engine(
        "main",
        ec=ec_config(disk_dir=str(directory), hmac_secret_env="VC_SECRET"),
        env={"VC_SECRET": "secret-two"},
    )
    assert same["workloads"]["main"]["encoded"] == 0
    assert same["workloads"]["main"]["outputs"] == stock["workloads"]["main"]["outputs"]


def test_an_entry_evicted_right_after_has_cache_item_still_serves_its_request(
    stock: dict[str, Any], populated_disk: dict[str, Any], run_engine: EngineRunner, tmp_path: Path
) -> None:
    # Between vLLM's question (scheduler) and the model step (worker) the entry disappears from
    # the tier. The scheduler answered yes only with the verified tensor in hand, and that copy is
    # what the worker receives: no request fails, none is re-encoded, outputs do not change.
    directory = copy_tier(populated_disk["directory"], tmp_path)
    report = run_engine("main", ec=ec_config(disk_dir=str(directory)), evict_after_load=True)
    main = report["workloads"]["main"]
    assert main["failed"] == 0
    assert main["encoded"] == 0
    assert main["outputs"] == stock["workloads"]["main"]["outputs"]
    assert report["connector"]["hits"] == DISTINCT
    tier = DiskTier(directory)
    assert _entry_keys(tier) == []  # really gone before the worker used them
    tier.close()
