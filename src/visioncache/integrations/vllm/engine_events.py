"""What the scheduler half must learn from the engine: weights that may have changed, adapters loaded.

A running vLLM engine's weights can change in place: RL frameworks refit it every step through
``collective_rpc`` (vLLM's own weight-transfer API, ``reload_weights``, a worker extension's
``update_weights``), or edit the model object directly and then call ``reset_encoder_cache`` (what
vLLM documents after a weight update) or ``reset_prefix_cache`` (what trl calls after its sync). A
connector sees none of these: its hooks are about requests. vLLM's EngineCore receives every one of
them, in the process where the scheduler half lives, between two scheduler steps. So the
connector wraps those EngineCore methods (`WEIGHT_EVENTS`, and ``add_lora`` for `adapters`), each
running vLLM's own method and then telling the engine's connector (`VisionCacheECConnector.engine_event`).
The wrapper finds the connector on the engine it runs on (``engine.scheduler.ec_connector``), so
an engine without this connector is unaffected.

Every weight event counts as a change, however it was meant (a ``collective_rpc`` can run any code
on the workers), except the calls of `READ_ONLY_RPCS`, which read the model only. What cannot be
observed is a change made directly on the model object in the caller's own process (an in-process
engine) followed by none of these calls: neither vLLM's own encoder cache nor any connector can see
it, and vLLM documents ``reset_encoder_cache`` for it.

The wrapped methods (vLLM 0.32 and 0.33 alike, `vllm.v1.engine.core.EngineCore`): the tuple below.
A vLLM without one of them is refused at start-up: the connector will not run where it cannot see
a weight update.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from visioncache.errors import ConfigurationError

__all__ = ["ADAPTER_EVENTS", "READ_ONLY_RPCS", "WEIGHT_EVENTS", "changes_weights", "observe_engine_core"]

WEIGHT_EVENTS = ("collective_rpc", "reset_encoder_cache", "reset_prefix_cache", "wake_up")
ADAPTER_EVENTS = ("add_lora",)
# Worker methods vLLM itself calls through collective_rpc that leave the weights alone: printing
# an LLM (get_model_inspection), weight checksums, timing stats, releasing a late-interaction
# query, the context length fitted at start-up.
READ_ONLY_RPCS = frozenset(
    {
        "compute_weight_checksums",
        "get_model_inspection",
        "get_encoder_timing_stats",
        "release_late_interaction_query_cache",
        "update_max_model_len",
    }
)
_MARK = "_visioncache_observed"
_lock = threading.Lock()


def changes_weights(event: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``event`` (a wrapped EngineCore method called with ``args``) may change the weights."""
    if event not in WEIGHT_EVENTS:
        return False
    if event == "collective_rpc":
        method = args[0] if args else kwargs.get("method")
        return not (isinstance(method, str) and method in READ_ONLY_RPCS)
    return True


def _connector_of(engine: Any) -> Callable[..., None] | None:
    connector = getattr(getattr(engine, "scheduler", None), "ec_connector", None)
    handler = getattr(connector, "engine_event", None)
    return handler if callable(handler) else None


def _wrap(name: str, original: Callable[..., Any], always: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def observed(self: Any, *args: Any, **kwargs: Any) -> Any:
        succeeded = False
        try:
            result = original(self, *args, **kwargs)
            succeeded = True
            return result
        finally:
            handler = _connector_of(self)
            if handler is not None and (succeeded or always):
                handler(name, args, kwargs)

    setattr(observed, _MARK, True)
    return observed


def observe_engine_core() -> None:
    """Wrap vLLM's EngineCore methods (once per process); ConfigurationError if one is missing."""
    from vllm.v1.engine import core

    engine_class = getattr(core, "EngineCore", None)
    missing = [
        name for name in (*WEIGHT_EVENTS, *ADAPTER_EVENTS) if not callable(getattr(engine_class, name, None))
    ]
    if engine_class is None or missing:
        raise ConfigurationError(
            f"VisionCacheECConnector cannot observe weight updates in this vLLM (EngineCore lacks "
            f"{missing or 'itself'}): it would serve encoder outputs of weights replaced at run time"
        )
    with _lock:
        for name in (*WEIGHT_EVENTS, *ADAPTER_EVENTS):
            original = engine_class.__dict__.get(name, getattr(engine_class, name))
            if getattr(original, _MARK, False):
                continue
            # A failed weight update may have changed some weights: it counts; a failed adapter
            # load loaded nothing.
            setattr(engine_class, name, _wrap(name, original, always=name in WEIGHT_EVENTS))
