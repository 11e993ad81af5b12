"""The connector against vLLM's interface: the installed ECConnectorBase, and the worker-side
wrappers of both model runners (V1's mixin and V2's ActiveECConnector; both files are
byte-identical in vLLM 0.32 and 0.33, and the V2 runner needs Triton, which this CPU lacks)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.config import ECTransferConfig
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorBase, ECConnectorRole

from tests.integrations.vllm_ec.conftest import CONNECTOR
from visioncache.integrations.vllm.connector import VisionCacheECConnector, VisionCacheECMetadata
from visioncache.integrations.vllm.item_store import ItemStore


def _parameters(function: Any) -> list[tuple[str, Any, Any]]:
    """Names, kinds and defaults: what a caller relies on (annotations are ours to add)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_every_abstract_method_of_the_installed_base_is_implemented() -> None:
    assert ECConnectorBase.__abstractmethods__  # the check is not vacuous
    for name in ECConnectorBase.__abstractmethods__:
        assert name in VisionCacheECConnector.__dict__, name
    assert not inspect.isabstract(VisionCacheECConnector)


def test_every_override_has_the_base_signature() -> None:
    overridden = [
        name
        for name, value in VisionCacheECConnector.__dict__.items()
        if callable(value) or isinstance(value, classmethod)
        if hasattr(ECConnectorBase, name) and not name.startswith("__")
    ]
    expected = {"has_cache_item", "update_state_after_alloc", "save_caches", "request_finished"}
    assert expected <= set(overridden)
    for name in overridden:
        ours, theirs = getattr(VisionCacheECConnector, name), getattr(ECConnectorBase, name)
        assert _parameters(ours) == _parameters(theirs), name


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[VisionCacheECConnector]:
    """A worker-side connector on a disk tier (a namespace set: no model directory needed)."""
    transfer = ECTransferConfig(
        **CONNECTOR,
        ec_role="ec_both",
        ec_connector_extra_config={"disk_dir": str(tmp_path / "tier"), "namespace": "interface-test"},
    )
    model = SimpleNamespace(dtype=torch.bfloat16, multimodal_config=None, is_encoder_decoder=False)
    config = SimpleNamespace(ec_transfer_config=transfer, model_config=model)
    connector = VisionCacheECConnector(config, ECConnectorRole.WORKER)
    yield connector
    connector.store.close()


DIGEST = bytes.fromhex("ab" * 32)


def _step(connector: VisionCacheECConnector, loaded: torch.Tensor) -> SimpleNamespace:
    saves = {"encoded": connector.store.key(DIGEST)}  # what the scheduler sends: key and namespace
    metadata = VisionCacheECMetadata(loads={"loaded": loaded}, saves=saves)
    return SimpleNamespace(ec_connector_metadata=metadata, finished_req_ids=set())


def _stored(connector: VisionCacheECConnector) -> torch.Tensor | None:
    assert connector.store.flush(10)
    reader = ItemStore(connector.store.chain, connector.store.namespace)
    entry = reader.load(reader.key(DIGEST)[0], num_embeds=None, dtype=torch.bfloat16)
    return None if entry is None else entry[0]


def test_v2_model_runner_wrapper_places_loads_saves_by_key_and_reports_once(
    worker: VisionCacheECConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.worker.gpu import ec_connector as v2

    monkeypatch.setattr(v2, "get_ec_transfer", lambda: worker)
    encoder_cache: dict[str, torch.Tensor] = {}
    wrapper = v2.ActiveECConnector(SimpleNamespace(), encoder_cache)
    loaded, encoded = torch.ones(3, 4, dtype=torch.float32), torch.full((2, 4), 7.0, dtype=torch.bfloat16)
    with wrapper.maybe_get_output(_step(worker, loaded)) as output:
        assert encoder_cache["loaded"].dtype == torch.bfloat16  # placed in the encoder's dtype
        encoder_cache["encoded"] = encoded  # what the encoder runner adds this step
    assert output is not None
    assert output.ec_connector_stats is None  # counts travel once, in the worker metadata
    assert output.ec_connector_worker_meta.saves == 1
    stored = _stored(worker)
    assert stored is not None and torch.equal(stored, encoded)


def test_v1_model_runner_mixin_places_loads_and_saves_by_key(
    worker: VisionCacheECConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.worker import ec_connector_model_runner_mixin as v1

    monkeypatch.setattr(v1, "get_ec_transfer", lambda: worker)
    monkeypatch.setattr(v1, "has_ec_transfer", lambda: True)
    mixin = v1.ECConnectorModelRunnerMixin
    encoder_cache: dict[str, torch.Tensor] = {}
    encoded = torch.full((2, 4), 3.0, dtype=torch.bfloat16)
    with mixin.maybe_get_ec_connector_output(_step(worker, torch.ones(3, 4)), encoder_cache) as output:
        assert "loaded" in encoder_cache
        encoder_cache["encoded"] = encoded
        mixin.maybe_save_ec_to_connector(encoder_cache, "encoded")
        encoder_cache["unkeyed"] = encoded  # no key from the scheduler: never saved
        mixin.maybe_save_ec_to_connector(encoder_cache, "unkeyed")
    assert output.ec_connector_worker_meta.saves == 1
    stored = _stored(worker)
    assert stored is not None and torch.equal(stored, encoded)
