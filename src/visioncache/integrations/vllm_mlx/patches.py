"""The replacements `install` puts into vllm-mlx (the list, with what each does, is in `install`).

Each replacement runs vllm-mlx's own method for anything the integration does not prepare, so a
text-only request, a video or audio request, a generator built before `install`, or one of a
model visioncache does not serve (`Installation.attach` leaves it unattached) behaves as in stock
vllm-mlx.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from visioncache.integrations.handles import Handles
from visioncache.integrations.mlx_vlm import Model, Processor
from visioncache.integrations.vllm_mlx.compat import GENERATOR, SCHEDULER, patched
from visioncache.integrations.vllm_mlx.prefix_cache import select_request
from visioncache.integrations.vllm_mlx.protocols import (
    GENERATOR_STATE,
    BatchGenerator,
    BatchRequest,
    Scheduler,
)
from visioncache.integrations.vllm_mlx.step import (
    STATE_ATTRIBUTE,
    EngineState,
    PreparedRequest,
    prepare_step,
    release_step,
)

__all__ = ["GENERATOR_METHODS", "GUARD", "SCHEDULER_METHODS", "Host", "replacements"]

# What is replaced, from the seam table (compat.SEAMS).
GENERATOR_METHODS = patched(GENERATOR, "MLLMBatchGenerator")
SCHEDULER_METHODS = patched(SCHEDULER, "MLLMScheduler")
(GUARD,) = patched(GENERATOR, "")


class Host(Protocol):
    """What the replacements ask of the installation that made them (`install.Installation`)."""

    @property
    def originals(self) -> Mapping[str, Any]: ...  # vllm-mlx's generator methods, by name
    @property
    def scheduler_originals(self) -> Mapping[str, Any]: ...
    @property
    def original_guard(self) -> Callable[[Any], bool]: ...
    @property
    def handles(self) -> Handles | None: ...

    def attach(self, generator: BatchGenerator) -> EngineState | None: ...
    def engine(self, model: Model, processor: Processor) -> EngineState | None: ...
    def note_request(self, request_id: str) -> None: ...
    def tenant_of(self, request: BatchRequest) -> str | None: ...
    def by_tenant(self, requests: Sequence[BatchRequest]) -> dict[str | None, list[BatchRequest]]: ...
    def tenant_state(self, state: EngineState, tenant: str | None) -> EngineState: ...


def _prepared(request: BatchRequest) -> PreparedRequest | None:
    prepared = getattr(request, STATE_ATTRIBUTE, None)
    return prepared if isinstance(prepared, PreparedRequest) else None


def _batch_ids(input_ids: Any) -> Any:
    return input_ids if input_ids.ndim == 2 else input_ids[None, :]


def replacements(installation: Host) -> tuple[dict[str, Any], dict[str, Any]]:
    """The batch generator's replacement methods (and the module guard), and the scheduler's."""
    return generator_replacements(installation), scheduler_replacements(installation)


def generator_replacements(installation: Host) -> dict[str, Any]:
    """``MLLMBatchGenerator``'s replacement methods, and the module's prefix-cache guard."""
    originals = installation.originals
    init, process, preprocess = (
        originals["__init__"],
        originals["_process_prompts"],
        originals["_preprocess_request"],
    )
    run_vision_encoding, stock_stats = originals["_run_vision_encoding"], originals["get_vision_cache_stats"]
    stock_kwargs = originals["_language_model_kwargs"].__func__
    stock_guard = installation.original_guard

    def __init__(self: BatchGenerator, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        installation.attach(self)

    def _process_prompts(self: BatchGenerator, requests: list[BatchRequest]) -> Any:
        state: EngineState | None = getattr(self, GENERATOR_STATE, None)
        if state is None:  # a generator built before install: vllm-mlx's own path
            return process(self, requests)
        step = list(requests)  # vllm-mlx removes failed requests from `requests`
        # With --chunked-prefill-tokens too: vllm-mlx chunks text-only prompts only, an image
        # prompt is prefilled here as without it (one forward, its KV stored at its end).
        kv_reuse = state.kv_reuse and self.prefix_cache is not None
        probe = getattr(self.prefix_cache, "covered", None) if kv_reuse else None
        for tenant, group in installation.by_tenant(step).items():  # each tenant its own keys
            prepare_step(installation.tenant_state(state, tenant), group, kv_reuse=kv_reuse, probe=probe)
        try:
            return process(self, requests)
        finally:
            release_step(step)

    def _preprocess_request(self: BatchGenerator, request: BatchRequest) -> None:
        prepared = getattr(request, STATE_ATTRIBUTE, None)
        if prepared is None:
            return preprocess(self, request)  # type: ignore[no-any-return]
        if isinstance(prepared, Exception):
            raise prepared
        request.is_text_only = False
        return None

    def _run_vision_encoding(self: BatchGenerator, request: BatchRequest, cache: Any = None) -> Any:
        prepared = _prepared(request)
        if prepared is None:
            return run_vision_encoding(self, request, cache)
        output = prepared.family.forward(
            self.model, prepared.feed(_batch_ids(request.input_ids)), cache=cache
        )
        request.vision_encoded = True
        self._release_preprocessed_inputs(request)
        return output.logits if hasattr(output, "logits") else output

    def _language_model_kwargs(
        request: BatchRequest, position_start: int | None = None, position_end: int | None = None
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = stock_kwargs(request, position_start, position_end)
        prepared = _prepared(request)
        if prepared is not None and prepared.hook is not None and position_end is not None:
            feed = prepared.feed(_batch_ids(request.input_ids), position_start or 0)
            kwargs.update(prepared.family.window(feed, position_start or 0, position_end))
        return kwargs

    def get_vision_cache_stats(self: BatchGenerator) -> dict[str, Any]:
        state = getattr(self, GENERATOR_STATE, None)
        if state is None:  # a generator left to vllm-mlx's own code
            return stock_stats(self)  # type: ignore[no-any-return]
        stats = dict(self.vision_cache.get_stats())
        stats.update(state.stats.as_dict())
        if state.kv_tiers is not None:
            stats.update(state.kv_tiers.stats())
        if installation.handles is not None:
            stats.update(installation.handles.counters())
        refused = state.kv_reuse_refused or (
            None if self.prefix_cache is not None else "--disable-prefix-cache"
        )
        stats["kv_reuse_refused"] = refused  # why image prompts reuse no KV (None: they do)
        return stats

    def is_text_only_prefix_cache_request(request: BatchRequest) -> bool:
        prepared = _prepared(request)
        key = prepared.prefix_key if prepared is not None else None
        select_request(key, installation.tenant_of(request))
        return True if key is not None else bool(stock_guard(request))

    return {
        "__init__": __init__,
        "_process_prompts": _process_prompts,
        "_preprocess_request": _preprocess_request,
        "_run_vision_encoding": _run_vision_encoding,
        "_language_model_kwargs": staticmethod(_language_model_kwargs),
        "get_vision_cache_stats": get_vision_cache_stats,
        GUARD: is_text_only_prefix_cache_request,
    }


def scheduler_replacements(installation: Host) -> dict[str, Any]:
    """``MLLMScheduler``'s replacement methods."""
    scheduler_init = installation.scheduler_originals["__init__"]
    scheduler_add_request = installation.scheduler_originals["add_request"]

    def scheduler_init_checked(self: Scheduler, *args: Any, **kwargs: Any) -> None:
        scheduler_init(self, *args, **kwargs)
        installation.engine(self.model, self.processor)  # refuses the model now, at server start

    def add_request(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
        request_id = scheduler_add_request(self, *args, **kwargs)
        installation.note_request(request_id)  # in the HTTP request's handling: its tenant
        return request_id

    return {"__init__": scheduler_init_checked, "add_request": add_request}
