"""A client's word never names stored content: entries are keyed by what the encoder is given.

vLLM lets a client name an image (an image part's ``uuid``, ``multi_modal_uuids``): a 64-hex name
becomes the item identifier as it is, and any name sent with processor options is hashed with them
into an identifier indistinguishable from a content hash. Each test stores one image under a name,
restarts, and sends another image under the same name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.vllm_ec.conftest import EngineRunner, ec_config


@pytest.mark.parametrize(
    ("first", "second"),
    [("client-id-a", "client-id-b"), ("client-id-kwargs-a", "client-id-kwargs-b")],
    ids=["hex-id", "id-with-processor-kwargs"],
)
def test_regression_a_client_id_names_another_images_output_after_a_restart(
    run_engine: EngineRunner, tmp_path: Path, first: str, second: str
) -> None:
    config = ec_config(disk_dir=str(tmp_path / "tier"))
    run_engine(first, ec=config)
    restarted = run_engine(second, ec=config)["workloads"][second]
    alone = run_engine(second)["workloads"][second]
    assert restarted["failed"] == 0
    assert restarted["encoded"] == 1  # the other image under the same name is encoded
    assert restarted["outputs"] == alone["outputs"]


def test_the_same_image_under_another_client_id_is_found(run_engine: EngineRunner, tmp_path: Path) -> None:
    config = ec_config(disk_dir=str(tmp_path / "tier"))
    run_engine("client-id-a", ec=config)
    renamed = run_engine("client-id-a-renamed", ec=config)
    alone = run_engine("client-id-a-renamed")["workloads"]["client-id-a-renamed"]
    assert renamed["workloads"]["client-id-a-renamed"]["encoded"] == 0
    assert renamed["workloads"]["client-id-a-renamed"]["outputs"] == alone["outputs"]
    # Every item was hashed as its request arrived (`arrival_digests`), none on the scheduler's thread.
    assert renamed["connector"]["lookups"] > 0 and renamed["connector"].get("late_digests", 0) == 0
