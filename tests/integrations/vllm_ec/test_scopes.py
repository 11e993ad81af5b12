"""Keys that trust no name, on real vLLM: tenants by their cache_salt, LoRA adapters by their
content, weights by their epoch; checked with the encoder counted on the model and against vLLM
alone's tokens and top-5 logprobs.

Three engines share the work (each start costs tens of seconds): one with the connector over a
disk tier runs `first_steps`; then ``visioncache purge`` removes tenant B and tenant A's image Y
from the directory; a second engine restarted on it runs `restart_steps`; and vLLM alone (no
connector, its encoder cache reset wherever the connector's engine relies on something else) runs
`alone_steps` for the reference outputs. All three have tower/connector LoRA enabled and prefix
caching off.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pybase64
import pytest

from tests.integrations.vllm_ec.conftest import ROOT, RUN_TIMEOUT, ec_config, engine_env
from tests.integrations.vllm_ec.tiny_lora import copy_adapter, save_adapter
from tests.integrations.vllm_ec.workload import image_data_url

X, Y, Z = 700, 701, 702  # image seeds
TENANT_A, TENANT_B, TENANT_C = ("tenant-a-" + "a" * 32, "tenant-b-" + "b" * 32, "tenant-c-" + "c" * 32)


def _request(image: int, salt: str | None = None, lora: list[Any] | None = None) -> dict[str, Any]:
    return {"request": image, "salt": salt, "lora": lora}


def first_steps(adapter_a: Path, adapter_b: Path, adapter_a_copy: Path) -> list[dict[str, Any]]:
    return [
        _request(X, TENANT_A),  # 0: encoded
        _request(X, TENANT_B),  # 1: tenant B's first request for A's image: encoded again
        _request(X, TENANT_A),  # 2: tenant A again: a hit
        _request(X),  # 3: no cache_salt: the public namespace, its own entry
        _request(Y, TENANT_A),  # 4
        _request(X, lora=["x", 1, str(adapter_a), False]),  # 5: adapter A under the name "x"
        {"add_lora": ["x", 1, str(adapter_b), True]},  # 6: "x" reloaded in place with B's weights
        _request(X, lora=["x", 1, str(adapter_b), True]),  # 7: must not get A's encoder output
        _request(X, lora=["y", 2, str(adapter_a_copy), False]),  # 8: A's weights, another name
        {"update_weights": "collective_rpc", "seed": 1},  # 9: an RL refit, nothing reset
        _request(X),  # 10: must not get the old weights' output
        {"update_weights": "direct", "seed": 2},  # 11: model edited in place, then reset_encoder_cache
        _request(Y, TENANT_A),  # 12: tenant A's stored Y is of the old weights
        _request(Z),  # 13: encoded with the new weights
    ]


def restart_steps(adapter_a: Path, adapter_b: Path) -> list[dict[str, Any]]:
    return [
        _request(X, TENANT_A),  # 0: tenant A's entry, kept across the restart
        _request(X, TENANT_B),  # 1: tenant B was purged
        _request(X, TENANT_C),  # 2: a new tenant encodes
        _request(X),  # 3: the public entry of the weight files' weights
        _request(X, lora=["x", 1, str(adapter_b), False]),  # 4: "x" is now B's weights: B's entry
        _request(X, lora=["z", 2, str(adapter_a), False]),  # 5: A's weights under a third name
        _request(Z),  # 6: what the updated weights produced is never read after a restart
        _request(Y, TENANT_A),  # 7: tenant A's image Y was purged
    ]


def alone_steps(adapter_a: Path, adapter_b: Path) -> list[dict[str, Any]]:
    return [
        _request(X),  # 0
        _request(Y),  # 1
        _request(Z),  # 2
        _request(X, lora=["a", 1, str(adapter_a), False]),  # 3
        _request(X, lora=["b", 2, str(adapter_b), False]),  # 4
        {"update_weights": "collective_rpc", "seed": 1},  # 5
        {"reset_encoder_cache": True},  # 6
        _request(X),  # 7
        {"update_weights": "direct", "seed": 2},  # 8
        _request(Y),  # 9
        _request(Z),  # 10
    ]


def _run(
    model: Path, directory: Path, steps: list[dict[str, Any]], ec: dict[str, Any] | None
) -> dict[str, Any]:
    directory.mkdir(parents=True)
    command = [sys.executable, "-m", "tests.integrations.vllm_ec.scope_run", "--model", str(model)]
    command += ["--out", str(directory / "result.json"), "--steps", json.dumps(steps), "--lora"]
    if ec is not None:
        command += ["--ec-config", json.dumps(ec)]
    log = directory / "engine.log"
    with log.open("w") as output:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env=engine_env(directory / "encoder.log"),
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT,
        )
    if done.returncode != 0:
        raise AssertionError(f"engine run failed ({done.returncode}):\n{log.read_text()[-6000:]}")
    result: dict[str, Any] = json.loads((directory / "result.json").read_text())
    return result


@pytest.fixture(scope="module")
def runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("scopes")
    adapter_a, adapter_b = (
        save_adapter(root / "adapter-a", seed=11),
        save_adapter(root / "adapter-b", seed=12),
    )
    adapter_a_copy = copy_adapter(adapter_a, root / "elsewhere" / "adapter-a")
    config = ec_config(disk_dir=str(root / "tier"))
    first = _run(tiny_model, root / "first", first_steps(adapter_a, adapter_b, adapter_a_copy), config)
    image_y = root / "y.png"
    image_y.write_bytes(pybase64.b64decode(image_data_url(Y).split(",", 1)[1]))
    purged = [
        _purge(root / "tier", "--salt-env", "TENANT_B"),
        _purge(
            root / "tier", "--salt-env", "TENANT_A", "--image", str(image_y), "--vllm-model", str(tiny_model)
        ),
    ]
    restart = _run(tiny_model, root / "restart", restart_steps(adapter_a, adapter_b), config)
    alone = _run(tiny_model, root / "alone", alone_steps(adapter_a, adapter_b), None)
    return {
        "first": first["steps"],
        "restart": restart["steps"],
        "alone": alone["steps"],
        "totals": first,
        "purged": purged,
    }


def _purge(directory: Path, *flags: str) -> str:
    """``visioncache purge --disk DIRECTORY FLAGS`` (this environment's vLLM), its report."""
    environment = engine_env(directory.parent / "purge-encoder.log", TENANT_A=TENANT_A, TENANT_B=TENANT_B)
    done = subprocess.run(
        [sys.executable, "-m", "visioncache", "purge", "--disk", str(directory), *flags],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def _encoded(steps: list[dict[str, Any]], *indexes: int) -> list[int]:
    return [steps[index]["encoded"] for index in indexes]


def test_regression_two_tenants_sending_one_image_share_its_encoder_output(runs: dict[str, Any]) -> None:
    # Before, vLLM's own encoder cache and the connector keyed the image alike for every
    # cache_salt: tenant B's first request for tenant A's image cost nothing, telling B that A
    # had sent it (and B was served A's entry after a restart, on every replica).
    first, restart, alone = runs["first"], runs["restart"], runs["alone"]
    assert _encoded(first, 0, 1, 2, 3) == [1, 1, 0, 1]  # B and the public namespace encode; A hits
    assert _encoded(restart, 0, 2, 3) == [0, 1, 0]  # A's and the public entries survive; C encodes
    for steps, indexes in ((first, (0, 1, 2, 3)), (restart, (0, 1, 2, 3))):
        for index in indexes:
            assert steps[index]["output"] == alone[0]["output"]  # tokens and top-5 logprobs
    assert first[4]["encoded"] == 1 and first[4]["output"] == alone[1]["output"]


def test_regression_an_adapter_reloaded_under_its_name_gets_the_old_adapters_encoder_output(
    runs: dict[str, Any],
) -> None:
    # vLLM keys its encoder cache by the adapter's name: after "x" was reloaded in place with
    # other weights, the image's output under the old weights was served.
    first, alone = runs["first"], runs["alone"]
    assert first[5]["encoded"] == 1 and first[5]["output"] == alone[3]["output"]
    assert first[7]["encoded"] == 1
    assert first[7]["output"] == alone[4]["output"] != alone[3]["output"]


def test_the_same_adapter_weights_under_another_name_and_path_share_entries(runs: dict[str, Any]) -> None:
    first, restart, alone = runs["first"], runs["restart"], runs["alone"]
    assert first[8]["encoded"] == 0 and first[8]["output"] == alone[3]["output"]
    # After a restart, "x" names B's weights and "z" A's: each finds its weights' entry.
    assert _encoded(restart, 4, 5) == [0, 0]
    assert restart[4]["output"] == alone[4]["output"]
    assert restart[5]["output"] == alone[3]["output"]


def test_regression_weights_updated_in_a_running_engine_get_the_old_weights_encoder_outputs(
    runs: dict[str, Any],
) -> None:
    # The namespace digested the weight files at start-up: after a refit (collective_rpc) vLLM's
    # own cache, and after an edit + reset_encoder_cache the connector's disk tier, served the
    # image's output computed with the old weights.
    first, alone = runs["first"], runs["alone"]
    assert first[10]["encoded"] == 1 and first[10]["output"] == alone[7]["output"] != alone[0]["output"]
    assert first[12]["encoded"] == 1 and first[12]["output"] == alone[9]["output"] != alone[1]["output"]
    assert first[13]["encoded"] == 1 and first[13]["output"] == alone[10]["output"]
    assert runs["totals"]["connector"]["weight_epochs"] >= 2


def test_regression_outputs_of_weights_updated_at_run_time_are_served_after_a_restart(
    runs: dict[str, Any],
) -> None:
    # A restarted engine loads the weight files again; what the updated weights produced was
    # stored under the files' namespace and served to it.
    restart, alone = runs["restart"], runs["alone"]
    assert restart[6]["encoded"] == 1 and restart[6]["output"] == alone[2]["output"]
    assert restart[3]["output"] == alone[0]["output"]


def test_after_a_purge_of_a_tenant_or_of_a_tenants_image_the_next_request_encodes_again(
    runs: dict[str, Any],
) -> None:
    restart, alone = runs["restart"], runs["alone"]
    tenant, image = runs["purged"]
    assert "removed 1 entries" in tenant  # tenant B's one image
    assert "removed 2 entries" in image  # tenant A's Y: before and after the weight update
    assert restart[1]["encoded"] == 1 and restart[1]["output"] == alone[0]["output"]
    assert restart[7]["encoded"] == 1 and restart[7]["output"] == alone[1]["output"]
    assert restart[0]["encoded"] == 0  # tenant A's X stays
