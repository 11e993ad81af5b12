"""`engine_events`: the EngineCore methods that may change the weights reach the engine's connector
(vLLM's own EngineCore class, a stand-in engine object)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from vllm.v1.engine.core import EngineCore

from visioncache.integrations.vllm.engine_events import (
    ADAPTER_EVENTS,
    WEIGHT_EVENTS,
    changes_weights,
    observe_engine_core,
)


class _Executor:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def collective_rpc(self, method: Any, timeout: Any, args: Any, kwargs: Any) -> list[Any]:
        self.calls.append(method if isinstance(method, str) else "callable")
        if method == "fail":
            raise RuntimeError("a worker failed half-way through its update")
        return [None]

    def add_lora(self, lora_request: Any) -> bool:
        if lora_request == "bad":
            raise ValueError("no such adapter")
        return True


def _engine() -> tuple[Any, list[tuple[str, tuple[Any, ...]]]]:
    events: list[tuple[str, tuple[Any, ...]]] = []
    connector = SimpleNamespace(engine_event=lambda name, args, kwargs: events.append((name, args)))
    engine = SimpleNamespace(model_executor=_Executor(), scheduler=SimpleNamespace(ec_connector=connector))
    return engine, events


def test_every_observed_method_exists_on_the_installed_engine_and_is_wrapped_once() -> None:
    observe_engine_core()
    observe_engine_core()  # idempotent: a second connector in the process wraps nothing again
    for name in (*WEIGHT_EVENTS, *ADAPTER_EVENTS):
        method = EngineCore.__dict__[name]
        assert getattr(method, "_visioncache_observed", False), name
        assert not getattr(method.__wrapped__, "_visioncache_observed", False), name


def test_weight_updates_reach_the_connector_after_vllm_ran_them() -> None:
    observe_engine_core()
    engine, events = _engine()
    EngineCore.collective_rpc(engine, "update_weights", args=({"names": []},))
    EngineCore.collective_rpc(engine, "compute_weight_checksums")  # read-only: still reported
    assert engine.model_executor.calls == ["update_weights", "compute_weight_checksums"]
    assert [name for name, _ in events] == ["collective_rpc", "collective_rpc"]
    assert changes_weights(*events[0], {}) and not changes_weights(*events[1], {})
    with pytest.raises(RuntimeError):  # a failed update may have changed some weights: reported
        EngineCore.collective_rpc(engine, "fail")
    assert len(events) == 3


def test_a_failed_adapter_load_is_not_reported_and_an_engine_without_the_connector_is_untouched() -> None:
    observe_engine_core()
    engine, events = _engine()
    assert EngineCore.add_lora(engine, "good") is True
    with pytest.raises(ValueError):
        EngineCore.add_lora(engine, "bad")
    assert events == [("add_lora", ("good",))]
    bare = SimpleNamespace(model_executor=_Executor(), scheduler=SimpleNamespace(ec_connector=None))
    assert EngineCore.collective_rpc(bare, "update_weights") == [None]


@pytest.mark.parametrize(
    ("event", "args", "changes"),
    [
        ("collective_rpc", ("reload_weights",), True),
        ("collective_rpc", (lambda worker: None,), True),  # any code on the workers
        ("collective_rpc", ("get_model_inspection",), False),  # printing an LLM
        ("reset_encoder_cache", (), True),
        ("reset_prefix_cache", (), True),
        ("wake_up", (["weights"],), True),
        ("add_lora", ("request",), False),
    ],
)
def test_which_events_start_a_new_weight_epoch(event: str, args: tuple[Any, ...], changes: bool) -> None:
    assert changes_weights(event, args, {}) is changes
