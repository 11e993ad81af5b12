"""Installing the integration into vllm-mlx: the exact list of what is replaced, and how to undo it.

Patched (version-checked first, applied together; the replacements are in `patches`):

- ``MLLMScheduler.__init__`` (``vllm_mlx.mllm_scheduler``): after vllm-mlx's own, which runs at
  server start with the loaded model, the model's family is found and self-checked and its
  cache built (`Installation.engine`). A model visioncache cannot serve exactly (no family
  description, or a failed self-check) fails the start, with the reason, where the settings
  ask for it (``refuse_unsupported``: ``visioncache serve-mlx`` does); embedded, by default, it
  gets one warning and vllm-mlx's own code: its generators are not attached, so every method
  below runs vllm-mlx's own for them.
- ``MLLMBatchGenerator.__init__``: after vllm-mlx's own, ``self.vision_cache`` (vllm-mlx's import of
  ``VisionEmbeddingCache``, built with hard-coded settings) becomes the configured visioncache,
  and ``self.prefix_cache`` is wrapped by `ImageAwarePrefixCache`.
- ``MLLMBatchGenerator._process_prompts``: first prepares the step's image requests together
  (`prepare_step`), then runs vllm-mlx's own method unchanged.
- ``MLLMBatchGenerator._preprocess_request``: a prepared request is used as is; a request whose
  preparation failed raises its error there (vllm-mlx turns it into the request's error
  response); any other request runs vllm-mlx's own method.
- ``MLLMBatchGenerator._run_vision_encoding``: a prepared request's prefill runs the family's
  `forward` on its cached features (what the model's own forward feeds its language model,
  Qwen3-VL's deepstack features included); any other request runs vllm-mlx's own method.
- ``MLLMBatchGenerator._language_model_kwargs``: for a prepared request, also passes the family's
  inputs of the positions asked for (`Family.window`: input embeddings, deepstack rows, ...), so
  a KV prefix hit prefills its tail with the image features (vllm-mlx passes token ids only,
  which are right for text but not for images).
- ``MLLMBatchGenerator.get_vision_cache_stats``: the cache's stats plus `EngineStats` (and the
  image handles' counters, `HandleStats`).
- ``is_text_only_prefix_cache_request`` (module function): True also for prepared image requests,
  selecting their image-aware key (`select_request`), and the request's tenant for every key.
- ``MLLMScheduler.add_request``: after vllm-mlx's own, notes the new request's tenant (`tenants`).

Image handles (`handles`) add nothing here: the engine meets them in `prepare_step`, and their
HTTP side is a route and an ASGI middleware that `serve` adds to vllm-mlx's FastAPI app
(`handle_api.mount`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from visioncache import ConfigurationError, forking
from visioncache.integrations.handles import Handles
from visioncache.integrations.mlx_vlm import Model, Processor
from visioncache.integrations.mlx_vlm.families import Exactness, Family, check_family, family_for
from visioncache.integrations.vllm_mlx.compat import import_batch_generator_module, import_scheduler_module
from visioncache.integrations.vllm_mlx.kv_tiers import KVTierCollector, build_kv_tiers
from visioncache.integrations.vllm_mlx.metrics import (
    register_collector,
    register_engine_metrics,
    register_handle_metrics,
)
from visioncache.integrations.vllm_mlx.patches import (
    GENERATOR_METHODS,
    GUARD,
    SCHEDULER_METHODS,
    replacements,
)
from visioncache.integrations.vllm_mlx.prefix_cache import ImageAwarePrefixCache
from visioncache.integrations.vllm_mlx.protocols import GENERATOR_STATE, BatchGenerator, BatchRequest
from visioncache.integrations.vllm_mlx.settings import VisionCacheSettings
from visioncache.integrations.vllm_mlx.step import EngineState
from visioncache.integrations.vllm_mlx.tenants import NO_TENANT, current, warn_if_shared

__all__ = ["Installation", "install", "installed"]

logger = logging.getLogger(__name__)
# Not leaves (installing imports vllm-mlx; building an engine's state builds its tiers), so not
# `forking.lock()`s taken across a fork: a child gets them fresh instead (`_renew_locks_in_child`).
_lock = threading.Lock()
_installed: Installation | None = None
_TENANT_ATTRIBUTE = "_visioncache_tenant"  # set on vllm-mlx's MLLMBatchRequest: its tenant's secret
_MAX_NOTED = 65536  # request ids noted with their tenant and not yet scheduled (aborted ones age out)


class Installation:
    """The integration, installed; `uninstall` puts vllm-mlx's own code back."""

    def __init__(
        self, settings: VisionCacheSettings, module: ModuleType, scheduler_module: ModuleType
    ) -> None:
        self.settings = settings
        self.engines: dict[str, EngineState] = {}  # by cache namespace (one per model + processor)
        self.handles = (
            Handles(settings.salt, settings.tiers, settings.max_handle_bytes) if settings.handles else None
        )
        self.tenants = settings.tenant_keys()  # None: one tenant (settings.salt) or none
        warn_if_shared(settings.tiers.configured, self.tenants, settings.salt)
        self.prefix_caches: list[ImageAwarePrefixCache] = []  # every generator's, for a purge
        self.verify_api_key: Any = None  # the API-key check of the server's routes (None: vllm-mlx's)
        self._noted: OrderedDict[str, str | None] = OrderedDict()
        self._noted_lock = forking.lock()  # a leaf: only the notes' own operations run under it
        self._tenant_states: dict[tuple[str, str | None], EngineState] = {}
        self._tenant_handles: dict[str | None, Handles] = {}
        self._module = module
        self._scheduler_module = scheduler_module
        generator_class, scheduler_class = module.MLLMBatchGenerator, scheduler_module.MLLMScheduler
        self.originals = {name: inspect.getattr_static(generator_class, name) for name in GENERATOR_METHODS}
        self.scheduler_originals = {
            name: inspect.getattr_static(scheduler_class, name) for name in SCHEDULER_METHODS
        }
        self.original_guard = getattr(module, GUARD)
        self._engines_lock = threading.Lock()
        self._stock_models: set[int] = set()  # ids of models left to vllm-mlx's own code (warned)

    def engine(self, model: Model, processor: Processor) -> EngineState | None:
        """The engine state of a model and processor, built on first use: family found and
        self-checked on the loaded model, cache namespaced and built, metrics registered.

        Where visioncache cannot serve the model exactly: ConfigurationError with the reason if
        the settings refuse it (``refuse_unsupported``), else None (vllm-mlx's own code serves
        it), with one warning per model."""
        try:
            family = family_for(model, processor)
            exactness = check_family(family, model, processor)
        except ConfigurationError as error:
            if self.settings.refuse_unsupported:
                raise
            reason = str(error)  # not the error: its traceback holds the caller's frames
        else:
            return self._build(model, processor, family, exactness)
        self._left_to_stock(model, reason)
        return None

    def _build(self, model: Model, processor: Processor, family: Family, exactness: Exactness) -> EngineState:
        namespace = self.settings.namespace(model, processor)
        kv_reuse = self.settings.kv_reuse and exactness.split_prefill
        refused = None if kv_reuse else "--vision-cache-no-kv-reuse"
        if self.settings.kv_reuse and not kv_reuse:
            refused = (
                f"a prompt prefilled as a cached prefix plus a tail does not give one prefill's "
                f"logits on this {model.config.model_type} model (self-check)"
            )
            logger.warning("visioncache: KV reuse is off for image prompts: %s", refused)
        with self._engines_lock:
            state = self.engines.get(namespace)
            if state is None:
                cache = self.settings.build_cache(namespace)
                state = EngineState(cache, model, processor, family, self.settings.salt, kv_reuse, exactness)
                state.kv_reuse_refused = refused
                state.handles = self.handles
                if kv_reuse:
                    kv_tiers = build_kv_tiers(self.settings.tiers, self.settings.max_kv_bytes, namespace)
                    state.kv_tiers = kv_tiers
                    if kv_tiers is not None:
                        register_collector(KVTierCollector(kv_tiers))
                self.engines[namespace] = state
                if register_engine_metrics(cache, state.stats) and self.handles and len(self.engines) == 1:
                    register_handle_metrics(self.handles.stats)
        return state

    def _left_to_stock(self, model: Model, reason: str) -> None:
        """Warn, once per model, that vllm-mlx's own code serves it."""
        key = id(model)
        with self._engines_lock:
            if key in self._stock_models:
                return
            self._stock_models.add(key)
        with contextlib.suppress(TypeError):  # not weakly referenceable: its id stays marked
            weakref.finalize(model, self._stock_models.discard, key)
        logger.warning(
            "visioncache: not used for this model, vllm-mlx serves it with its own code: %s", reason
        )

    def attach(self, generator: BatchGenerator) -> EngineState | None:
        """Give a new batch generator its visioncache (and image-aware prefix cache); None, and
        the generator left as vllm-mlx built it, for a model visioncache does not serve.

        A generator built again for the same model and processor (vllm-mlx rebuilds it after a
        reset) gets the same cache and counters.
        """
        state = self.engine(generator.model, generator.processor)
        if state is None:
            return None
        generator.vision_cache = state.cache
        if generator.prefix_cache is not None and state.kv_reuse:
            generator.prefix_cache = ImageAwarePrefixCache(
                generator.prefix_cache, state.stats, state.salt, state.kv_tiers
            )
            self.prefix_caches.append(generator.prefix_cache)
        setattr(generator, GENERATOR_STATE, state)
        return state

    # ---- tenants (`tenants`) ---------------------------------------------------------------------
    def request_tenant(self) -> str | None:
        """The tenant secret of the HTTP request being handled (the salt: one tenant)."""
        if self.tenants is None:
            return self.settings.salt
        tenant = current.get()
        return None if tenant is NO_TENANT else tenant  # type: ignore[return-value]

    def note_request(self, request_id: str) -> None:
        """vllm-mlx made ``request_id`` in the current HTTP request's handling: remember its tenant."""
        if self.tenants is not None:
            tenant = self.request_tenant()
            with self._noted_lock:
                self._noted[request_id] = tenant
                while len(self._noted) > _MAX_NOTED:
                    self._noted.popitem(last=False)

    def tenant_of(self, request: BatchRequest) -> str | None:
        """The tenant secret of one of vllm-mlx's batch requests (kept on it from its first step)."""
        if self.tenants is None:
            return self.settings.salt
        if not hasattr(request, _TENANT_ATTRIBUTE):
            with self._noted_lock:
                noted = self._noted.pop(request.request_id, None)
            setattr(request, _TENANT_ATTRIBUTE, noted)
        tenant: str | None = getattr(request, _TENANT_ATTRIBUTE)
        return tenant

    def by_tenant(self, requests: Sequence[BatchRequest]) -> dict[str | None, list[BatchRequest]]:
        """A step's requests grouped by tenant, in order."""
        groups: dict[str | None, list[BatchRequest]] = {}
        for request in requests:
            groups.setdefault(self.tenant_of(request), []).append(request)
        return groups

    def tenant_state(self, state: EngineState, tenant: str | None) -> EngineState:
        """``state`` as ``tenant`` sees it: its cache view and handles, the same counters."""
        if tenant == state.salt:
            return state
        key = (state.cache.namespace, tenant)
        view = self._tenant_states.get(key)
        if view is None:
            view = dataclasses.replace(
                state, cache=state.cache.with_salt(tenant), salt=tenant, handles=self.handles_for(tenant)
            )
            self._tenant_states[key] = view
        return view

    def handles_for(self, tenant: str | None) -> Handles | None:
        """The image handles of ``tenant`` (sealed and kept under its secret); None: handles off."""
        if self.handles is None or tenant == self.settings.salt:
            return self.handles
        handles = self._tenant_handles.get(tenant)
        if handles is None:
            handles = self._tenant_handles[tenant] = self.handles.for_tenant(tenant)
        return handles

    def uninstall(self) -> None:
        """Restore vllm-mlx's methods (generators built meanwhile keep their caches)."""
        global _installed
        with _lock:
            for name, original in self.originals.items():
                setattr(self._module.MLLMBatchGenerator, name, original)
            for name, original in self.scheduler_originals.items():
                setattr(self._scheduler_module.MLLMScheduler, name, original)
            setattr(self._module, GUARD, self.original_guard)
            if _installed is self:
                _installed = None

    def close(self) -> None:
        """Flush and close every engine's cache (their shared tiers' pending writes included)."""
        for state in self.engines.values():
            state.cache.close()
            if state.kv_tiers is not None:
                state.kv_tiers.close()
        if self.handles is not None:
            self.handles.close()

    def _apply(self) -> None:
        generator, scheduler = replacements(self)
        for name in GENERATOR_METHODS:
            setattr(self._module.MLLMBatchGenerator, name, generator[name])
        for name in SCHEDULER_METHODS:
            setattr(self._scheduler_module.MLLMScheduler, name, scheduler[name])
        setattr(self._module, GUARD, generator[GUARD])


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
        installation = Installation(settings, module, import_scheduler_module())
        installation._apply()
        _installed = installation
    return installation


def installed() -> Installation | None:
    """The active installation, if any."""
    return _installed


def _renew_locks_in_child() -> None:
    """A child forked while one of the parent's threads installed or built an engine's state
    would inherit that lock held by a thread it does not have, and wait forever at its first
    use: it gets new ones. An engine state the thread was building is built again on first use
    (it was not yet in ``engines``); an installation half applied stays as the parent had it."""
    global _lock
    _lock = threading.Lock()
    if _installed is not None:
        _installed._engines_lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_locks_in_child)
