"""Every family beyond Qwen2-VL (whose suite is the other files) on real vLLM: a restart on the
same disk tier encodes nothing, a second replica over Redis encodes nothing, and both answer as
vLLM alone (greedy tokens and top-5 logprobs). One set of engine runs per family."""

from __future__ import annotations

import base64
import functools
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from transformers import AutoProcessor

from tests.integrations.vllm_ec.conftest import ec_config, engine_runner
from tests.integrations.vllm_ec.families import FAMILIES, Family
from tests.integrations.vllm_ec.workload import FAMILY, WARM_UP_SEED, image_data_url
from tests.tiers.conftest import RedisProcess
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.serialization import loads

DISTINCT = FAMILY.distinct + 1  # the workload's images and the warm-up image


@pytest.fixture(scope="module", params=FAMILIES[1:], ids=str)
def runs(
    request: pytest.FixtureRequest, redis_server: RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    family: Family = request.param
    root = tmp_path_factory.mktemp(family.name)
    model = family.save(root / "model")
    runner = engine_runner(model, _mkdir(root / "runs"), family.encoder_model, family.max_model_len)
    run = functools.partial(runner, budget=family.budget)
    disk, prefix = root / "tier", f"visioncache-{family.name}:"
    shared = {"redis_url": redis_server.url, "redis_prefix": prefix}
    return {
        "family": family,
        "model": model,
        "disk": disk,
        "alone": run("family")["workloads"]["family"],
        "cold": run("family", ec=ec_config(disk_dir=str(disk), **shared)),
        "restart": run("family", ec=ec_config(disk_dir=str(disk))),
        "replica": run("family", ec=ec_config(**shared)),
    }


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_vllm_alone_encodes_each_distinct_image_once(runs: dict[str, Any]) -> None:
    assert runs["alone"]["failed"] == 0
    assert runs["alone"]["encoded"] == FAMILY.distinct


def test_a_cold_run_answers_as_vllm_alone_and_saves_every_item(runs: dict[str, Any]) -> None:
    cold = runs["cold"]
    assert cold["workloads"]["family"]["outputs"] == runs["alone"]["outputs"]
    assert cold["workloads"]["family"]["encoded"] == FAMILY.distinct
    assert cold["connector"]["saves"] == DISTINCT


def test_a_restart_on_the_same_disk_tier_encodes_nothing(runs: dict[str, Any]) -> None:
    restart = runs["restart"]
    assert restart["workloads"]["family"]["encoded"] == 0
    assert restart["workloads"]["family"]["failed"] == 0
    assert restart["workloads"]["family"]["outputs"] == runs["alone"]["outputs"]
    assert restart["connector"]["hits"] == DISTINCT


def test_a_second_replica_over_redis_encodes_nothing(runs: dict[str, Any]) -> None:
    replica = runs["replica"]
    assert replica["workloads"]["family"]["encoded"] == 0
    assert replica["workloads"]["family"]["outputs"] == runs["alone"]["outputs"]
    assert replica["connector"]["hits"] == DISTINCT


def test_stored_outputs_have_the_familys_shape(runs: dict[str, Any]) -> None:
    # What the connector stores is vLLM's encoder output as it is: one row per image token the
    # family's own processor writes for that image (Gemma 3: 16 rows for its 18-token placeholder;
    # the tiled families: every tile's and the thumbnail's or global image's rows, LLaVA-OneVision's
    # newline rows too), and Qwen3-VL's rows carry the deepstack features (3x the text width).
    tier = DiskTier(runs["disk"])
    try:
        keys = [key for key in tier.keys() if "/vllm-ec/" in key]  # noqa: SIM118  (a tier, not a dict)
        values = [loads(tier.get(key) or b"", context=key)["value"] for key in keys]
    finally:
        tier.close()
    assert len(values) == DISTINCT
    assert all(value.dtype == torch.bfloat16 for value in values)
    widths = {value.shape[1] for value in values}
    assert widths == ({3 * 128} if runs["family"].name == "qwen3_vl" else {128})
    assert sorted(value.shape[0] for value in values) == _image_tokens(runs["model"])


def _image_tokens(model: Path) -> list[int]:
    """Image tokens the checkpoint's processor writes for each image a family run sends, sorted."""
    processor = AutoProcessor.from_pretrained(model)
    config = json.loads((model / "config.json").read_text())
    image_token = config.get("image_token_id", config.get("image_token_index"))
    counts = []
    for seed in (*range(FAMILY.first_seed, FAMILY.first_seed + FAMILY.distinct), WARM_UP_SEED):
        encoded = base64.b64decode(image_data_url(seed).partition(",")[2])
        image = Image.open(io.BytesIO(encoded)).convert("RGB")
        message = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]}
        text = processor.apply_chat_template([message], add_generation_prompt=True, tokenize=False)
        ids = processor(text=text, images=[image], return_tensors="pt")["input_ids"]
        counts.append(int((ids == image_token).sum()))
    return sorted(counts)


def test_the_unsigned_tier_warning_appears_once_per_process(runs: dict[str, Any]) -> None:
    # An in-process engine builds two chains (scheduler and worker halves), both over an unsigned
    # Redis: one warning.
    log = Path(runs["replica"]["log"]).read_text()
    assert log.count("have no HMAC secret") == 1
