"""Installing the integration into vllm-mlx: the exact list of what is replaced, and how to undo it.

Patched (all on ``vllm_mlx.mllm_batch_generator``, version-checked first, applied together):

- ``MLLMBatchGenerator.__init__``: after vllm-mlx's own, ``self.vision_cache`` (vllm-mlx's import of
  ``VisionEmbeddingCache``, built with hard-coded settings) becomes the configured visioncache,
  and ``self.prefix_cache`` is wrapped by `ImageAwarePrefixCache`.
- ``MLLMBatchGenerator._process_prompts``: first prepares the step's image requests together
  (`prepare_step`), then runs vllm-mlx's own method unchanged.
- ``MLLMBatchGenerator._preprocess_request``: a prepared request is used as is; a request whose
  preparation failed raises its error there (vllm-mlx turns it into the request's error
  response); any other request runs vllm-mlx's own method.
- ``MLLMBatchGenerator._language_model_kwargs``: for a prepared request, also passes the input
  embeddings of the positions asked for, so a KV prefix hit prefills its tail with the image
  features (vllm-mlx passes token ids only, which are right for text but not for images).
- ``MLLMBatchGenerator.get_vision_cache_stats``: the cache's stats plus `EngineStats`.
- ``is_text_only_prefix_cache_request`` (module function): True also for prepared image requests,
  selecting their image-aware key (`select_request`).
"""

from __future__ import annotations

import inspect
import threading
from types import ModuleType
from typing import Any

from visioncache import ConfigurationError
from visioncache.integrations.mlx_vlm import check_model, check_processor
from visioncache.integrations.vllm_mlx.compat import (
    PATCHED_FUNCTION,
    PATCHED_METHODS,
    import_batch_generator_module,
)
from visioncache.integrations.vllm_mlx.metrics import register_engine_metrics
from visioncache.integrations.vllm_mlx.prefix_cache import ImageAwarePrefixCache, select_request
from visioncache.integrations.vllm_mlx.settings import VisionCacheSettings
from visioncache.integrations.vllm_mlx.step import (
    STATE_ATTRIBUTE,
    EngineState,
    PreparedRequest,
    prepare_step,
    release_step,
)

__all__ = ["Installation", "install", "installed"]

_METHODS = tuple(PATCHED_METHODS)
_GUARD = PATCHED_FUNCTION
_lock = threading.Lock()
_installed: Installation | None = None


class Installation:
    """The integration, installed; `uninstall` puts vllm-mlx's own code back."""

    def __init__(self, settings: VisionCacheSettings, module: ModuleType) -> None:
        self.settings = settings
        self.engines: dict[str, EngineState] = {}  # by cache namespace (one per model + processor)
        self._module = module
        generator_class = module.MLLMBatchGenerator
        self._originals = {name: inspect.getattr_static(generator_class, name) for name in _METHODS}
        self._original_guard = getattr(module, _GUARD)

    def attach(self, generator: Any) -> EngineState:
        """Give a new batch generator its visioncache (and image-aware prefix cache).

        A generator built again for the same model and processor (vllm-mlx rebuilds it after a
        reset) gets the same cache and counters.
        """
        model, processor = generator.model, generator.processor
        check_model(model)  # Qwen3-VL and others: refused with the reason
        check_processor(processor)
        namespace = self.settings.namespace(model, processor)
        state = self.engines.get(namespace)
        if state is None:
            cache = self.settings.build_cache(namespace)
            state = EngineState(cache, model, processor, self.settings.salt, self.settings.kv_reuse)
            self.engines[namespace] = state
            register_engine_metrics(cache, state.stats)
        generator.vision_cache = state.cache
        if generator.prefix_cache is not None and state.kv_reuse:
            generator.prefix_cache = ImageAwarePrefixCache(generator.prefix_cache, state.stats, state.salt)
        generator._visioncache_state = state
        return state

    def uninstall(self) -> None:
        """Restore vllm-mlx's methods (generators built meanwhile keep their caches)."""
        global _installed
        with _lock:
            for name, original in self._originals.items():
                setattr(self._module.MLLMBatchGenerator, name, original)
            setattr(self._module, _GUARD, self._original_guard)
            if _installed is self:
                _installed = None

    def close(self) -> None:
        """Flush and close every engine's cache (their shared tiers' pending writes included)."""
        for state in self.engines.values():
            state.cache.close()

    def _apply(self) -> None:
        replacements = _replacements(self)
        for name in _METHODS:
            setattr(self._module.MLLMBatchGenerator, name, replacements[name])
        setattr(self._module, _GUARD, replacements[_GUARD])


def _replacements(installation: Installation) -> dict[str, Any]:
    originals = installation._originals
    init, process, preprocess = (
        originals["__init__"],
        originals["_process_prompts"],
        originals["_preprocess_request"],
    )
    stock_kwargs = originals["_language_model_kwargs"].__func__
    stock_guard = installation._original_guard

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        installation.attach(self)

    def _process_prompts(self: Any, requests: list[Any]) -> Any:
        state: EngineState | None = getattr(self, "_visioncache_state", None)
        if state is None:  # a generator built before install: vllm-mlx's own path
            return process(self, requests)
        step = list(requests)  # vllm-mlx removes failed requests from `requests`
        chunked = hasattr(self, "_chunked_prefill_budget")  # its prefill path keys by token ids only
        prepare_step(state, step, kv_reuse=state.kv_reuse and self.prefix_cache is not None and not chunked)
        try:
            return process(self, requests)
        finally:
            release_step(step)

    def _preprocess_request(self: Any, request: Any) -> None:
        prepared = getattr(request, STATE_ATTRIBUTE, None)
        if prepared is None:
            return preprocess(self, request)  # type: ignore[no-any-return]
        if isinstance(prepared, Exception):
            raise prepared
        request.is_text_only = False
        return None

    def _language_model_kwargs(
        request: Any, position_start: int | None = None, position_end: int | None = None
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = stock_kwargs(request, position_start, position_end)
        prepared = getattr(request, STATE_ATTRIBUTE, None)
        if (
            isinstance(prepared, PreparedRequest)
            and prepared.features is not None
            and position_end is not None
        ):
            embeddings = prepared.input_embeddings(request.input_ids)
            kwargs["inputs_embeds"] = embeddings[:, position_start:position_end]
        return kwargs

    def get_vision_cache_stats(self: Any) -> dict[str, Any]:
        stats = dict(self.vision_cache.get_stats())
        state = getattr(self, "_visioncache_state", None)
        if state is not None:
            stats.update(state.stats.as_dict())
        return stats

    def is_text_only_prefix_cache_request(request: Any) -> bool:
        prepared = getattr(request, STATE_ATTRIBUTE, None)
        key = prepared.prefix_key if isinstance(prepared, PreparedRequest) else None
        select_request(key)
        return True if key is not None else bool(stock_guard(request))

    return {
        "__init__": __init__,
        "_process_prompts": _process_prompts,
        "_preprocess_request": _preprocess_request,
        "_language_model_kwargs": staticmethod(_language_model_kwargs),
        "get_vision_cache_stats": get_vision_cache_stats,
        _GUARD: is_text_only_prefix_cache_request,
    }


def install(settings: VisionCacheSettings | None = None, **options: Any) -> Installation:
    """Install the integration into vllm-mlx (every batch generator built afterwards uses it).

    ``settings`` or keyword ``options`` (`VisionCacheSettings.from_options`, e.g.
    ``model_path=...``, ``disk_dir=...``). The vllm-mlx version is checked first; on another
    version nothing is patched and ConfigurationError says which version is supported.
    """
    global _installed
    if settings is None:
        settings = VisionCacheSettings.from_options(**options)
    elif options:
        raise ConfigurationError("give settings or keyword options, not both")
    with _lock:
        if _installed is not None:
            raise ConfigurationError("the vllm-mlx integration is already installed; uninstall() it first")
        module = import_batch_generator_module()  # version and seams checked before any change
        installation = Installation(settings, module)
        installation._apply()
        _installed = installation
    return installation


def installed() -> Installation | None:
    """The active installation, if any."""
    return _installed
