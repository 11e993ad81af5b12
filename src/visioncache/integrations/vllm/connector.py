"""vLLM encoder-cache connector: vision-encoder outputs shared across restarts, replicas and hosts.

Load it out of tree (the vLLM releases in `versions.SUPPORTED`)::

    --ec-transfer-config '{"ec_connector": "VisionCacheECConnector",
        "ec_connector_module_path": "visioncache.integrations.vllm", "ec_role": "ec_both",
        "ec_connector_extra_config": {"disk_dir": "/var/cache/visioncache", "disk_max_bytes": "20GiB"}}'

Keys. An entry is keyed by what the encoder is given for the item (its processed inputs, hashed
as each request arrives, off the scheduler's critical path: `encoder_inputs`, `arrival_digests`),
never by vLLM's item identifier, which a client can choose, in the item's scope (`item_store`):
the deployment's namespace in its weight epoch, the content of a LoRA adapter that reaches the
encoder (`adapters`), and the request's ``cache_salt`` as its tenant. The scheduler also prefixes
each item's identifier with its scope's tag the first time it sees the item (`scheduled_items`),
so vLLM's own encoder cache keeps tenants, adapters and weight epochs apart as well. Weight
updates inside the running engine are observed where the engine receives them (`engine_events`)
and move the namespace to a new epoch.

How the two halves meet. The scheduler half (EngineCore) and the worker half share no memory, so
the scheduler does the reading: when vLLM asks ``has_cache_item`` for an item it would otherwise
encode, the connector loads the entry from the tiers, verifies it (digest or HMAC, dtype, and the
number of embeddings the request's placeholders expect) and holds it. Only then does it answer
True, and the verified tensor travels to the workers inside the step's connector metadata, with
the key of each item the workers encode instead. So an
entry that is evicted, corrupted or whose tier dies after the answer cannot fail the request:
nothing is read again. Any failure before the answer is a miss, and vLLM encodes the item as usual.
A tier that fails costs at most one timeout per ``retry_interval`` (its circuit breaker).

Workers save what they encode (`worker_saves`): ``save_caches`` notes the output, and at the end
of the step the connector hands it to the background writer (a host copy, bounded in bytes; a
full budget drops the save and counts it). The model step never waits for disk or Redis. At
shutdown every save is written or counted as dropped, within vLLM's grace period.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from visioncache.integrations.vllm.installed import TRANSFORMERS_VERSION, VLLM_VERSION  # checks them

from vllm.distributed.ec_transfer.ec_connector.base import (  # isort: skip  (after the check)
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
)

from typing_extensions import override

from visioncache import CacheStats, ConfigurationError
from visioncache.integrations.vllm.arrival_digests import hash_on_arrival
from visioncache.integrations.vllm.config import ConnectorConfig
from visioncache.integrations.vllm.counters import ConnectorCounters
from visioncache.integrations.vllm.engine_events import observe_engine_core
from visioncache.integrations.vllm.engine_stats import (
    VisionCacheECStats,
    VisionCachePromMetrics,
    WorkerCounts,
)
from visioncache.integrations.vllm.item_store import ItemStore, build_chain
from visioncache.integrations.vllm.namespace import engine_namespace
from visioncache.integrations.vllm.scheduled_items import ScheduledItems
from visioncache.integrations.vllm.scopes import Scopes
from visioncache.integrations.vllm.staging import VerifiedItems
from visioncache.integrations.vllm.worker_saves import WorkerSaves, shutdown_seconds

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ECConnectorOutput
    from vllm.v1.request import Request

__all__ = ["VisionCacheECConnector", "VisionCacheECMetadata"]

# vLLM configures the "vllm" logger only: its children print in vLLM's log, at its level and format.
logger = logging.getLogger("vllm.visioncache")
# Verified entries the scheduler holds between `has_cache_item` and the step's metadata.
_STAGED_MAX_BYTES = 512 * 2**20


@dataclass
class VisionCacheECMetadata(ECConnectorMetadata):  # type: ignore[misc]  # vLLM is untyped for mypy
    """One step's loads (item identifier -> verified encoder output, host memory) and where each
    item the workers encode is saved (identifier -> (tier key, its namespace)): the scheduler's
    keys, in the weight epoch the step was scheduled in."""

    loads: dict[str, torch.Tensor] = field(default_factory=dict)
    saves: dict[str, tuple[str, str]] = field(default_factory=dict)


class VisionCacheECConnector(ECConnectorBase):  # type: ignore[misc]  # vLLM is untyped for mypy
    """visioncache's tiers (disk, Redis/Valkey) as vLLM's encoder cache (see the module docstring)."""

    def __init__(self, vllm_config: VllmConfig, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        transfer = vllm_config.ec_transfer_config
        self.config = ConnectorConfig.from_extra_config(transfer.ec_connector_extra_config)
        _require_inputs_in_the_scheduler(vllm_config)
        self._dtype: torch.dtype = vllm_config.model_config.dtype
        # What changes outputs beyond the model: vLLM (decoding, kernels), its processors, torch's kernels.
        versions = f"vllm={VLLM_VERSION};transformers={TRANSFORMERS_VERSION};torch={torch.__version__}"
        namespace = self.config.namespace or engine_namespace(vllm_config, versions)
        self.store = ItemStore(build_chain(self.config), namespace)
        logger.info(
            "VisionCacheECConnector (%s): namespace %s, tiers %s",
            role.name,
            namespace,
            [tier.name for tier in self.store.chain.tiers],
        )
        self.counters = ConnectorCounters(self.store.stats)
        if role == ECConnectorRole.SCHEDULER and not getattr(vllm_config, "shutdown_timeout", 1):
            logger.warning(
                "VisionCacheECConnector: vLLM's --shutdown-timeout is 0: on SIGTERM vLLM kills its "
                "processes at once, and encoder outputs still queued for the tiers are lost without "
                "being counted (a restart encodes them again). Give --shutdown-timeout 10 or more for "
                "every queued output to be written or counted as dropped."
            )
        # Scheduler side: the items being scheduled, verified entries held, this step's loads and
        # the keys of what the workers encode.
        lora = getattr(vllm_config, "lora_config", None)
        self._scopes = Scopes(
            self.store,
            ignore_cache_salt=self.config.ignore_cache_salt,
            adapters_reach_the_encoder=bool(getattr(lora, "enable_tower_connector_lora", False)),
        )
        self._items = ScheduledItems(self._scopes.scope_of, self._scopes.prefix, self.counters.add)
        self._staged = VerifiedItems(_STAGED_MAX_BYTES)
        self._loads: dict[str, torch.Tensor] = {}
        self._save_keys: dict[str, tuple[str, str]] = {}
        self._unavailable: set[str] = set()
        # Read by `arrival_digests` on vLLM's input thread: this engine's items are hashed on arrival.
        self.hashes_on_arrival = role == ECConnectorRole.SCHEDULER
        if role == ECConnectorRole.SCHEDULER:
            observe_engine_core()  # weight updates and adapter loads reach `engine_event`
            hash_on_arrival()  # each item's digest taken on vLLM's input thread
            self._scopes.log_tenancy()
        # Worker side: this step's outputs to save, and where loads go.
        self._saves = WorkerSaves(self.store, self.counters)
        self._device: torch.device | None = None

    # ---- scheduler side --------------------------------------------------------------------
    @override
    def ensure_cache_available(self, request: Request, num_computed_tokens: int) -> bool:
        """Note the not-yet-computed items of ``request``: vLLM asks about them next. Reads
        nothing; never defers."""
        self._items.note_request(request, num_computed_tokens)
        return True

    def _key(self, request: Request, index: int) -> tuple[str, str] | None:
        """(tier key, namespace) of a request's item in the current epoch; None: not keyed."""
        scope = self._items.scope(request)
        digest = self._items.digest_of(request, index)
        return None if scope is None or digest is None else self.store.key(digest, scope)

    @override
    def has_cache_item(self, identifier: str) -> bool:
        """True only once the item's verified output is in hand (held until the step's metadata)."""
        if not self.is_consumer:
            return False
        located = self._items.located(identifier)
        keyed = None if located is None else self._key(*located)
        if keyed is None:
            return False
        key = keyed[0]
        if self._staged.touch(key):
            return True
        started = time.perf_counter()
        try:
            expected = self._items.expected_embeds(identifier)
            entry = self.store.load(key, num_embeds=expected, dtype=self._dtype)
        except Exception:  # the connector must never fail a request: a miss
            logger.exception("VisionCacheECConnector: loading %s failed; encoding it", identifier)
            entry = None
        count = self.counters.add
        count("lookups", 1)
        count("load_seconds", time.perf_counter() - started)
        if entry is None:
            count("misses", 1)
            return False
        tensor, cost = entry
        count("hits", 1)
        count("seconds_saved", cost)
        count("loaded_bytes", tensor.nbytes)
        self._staged.put(key, tensor)
        return True

    @override
    def update_state_after_alloc(self, request: Request, index: int) -> None:
        identifier = request.mm_features[index].identifier
        keyed = self._key(request, index)
        if keyed is None:
            return  # no key: vLLM encodes it and nothing is saved
        tensor = self._staged.pop(keyed[0])
        if tensor is None:  # vLLM encodes this item: the workers save it under its key
            if self.is_producer:
                self._save_keys[identifier] = keyed
            return
        if tensor.shape[0] != request.get_num_encoder_embeds(index):
            # Unreachable while `ensure_cache_available` runs first (vLLM 0.32 calls it before
            # every encoder decision); kept so a change in vLLM fails one request, not the engine.
            logger.error(
                "VisionCacheECConnector: %s has the wrong length; failing request %s",
                identifier,
                request.request_id,
            )
            self._unavailable.add(request.request_id)
            return
        self._loads[identifier] = tensor

    @override
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> VisionCacheECMetadata:
        metadata = VisionCacheECMetadata(loads=self._loads, saves=self._save_keys)
        self._loads, self._save_keys = {}, {}
        self._items.end_step()
        return metadata

    @override
    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        self._items.finished(request.request_id)
        return False, None

    def engine_event(self, event: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """An EngineCore method `engine_events` observes has run (`Scopes.observe`); after one
        that may have changed the weights, no verified entry held is served either."""
        if self._scopes.observe(event, args, kwargs):
            self._staged.clear()
            self.counters.add("weight_epochs", 1)

    @override
    def take_unavailable_requests(self) -> set[str]:
        unavailable, self._unavailable = self._unavailable, set()
        return unavailable

    @override
    def update_connector_output(self, connector_output: ECConnectorOutput) -> None:
        counts = connector_output.ec_connector_worker_meta
        if isinstance(counts, WorkerCounts):
            for name, value in counts.as_dict().items():
                self.counters.add(name, value)

    @override
    def get_ec_connector_stats(self) -> VisionCacheECStats | None:
        """This interval's counters, with the tiers' error counts since the last call. The
        scheduler half reports for both: vLLM's V2 model runner also asks the worker half, whose
        counts already travel in `WorkerCounts`, so it answers None."""
        if self.role == ECConnectorRole.WORKER:
            return None
        interval = self.counters.take_interval()
        return None if interval is None else VisionCacheECStats(data=interval)

    def totals(self) -> dict[str, float]:
        """Every counter since start-up (this half of the connector), tiers' counts included."""
        return self.counters.totals()

    def snapshot(self) -> CacheStats:
        """Since start-up, as a visioncache snapshot: ``visioncache.metrics.register_metrics(
        connector)`` exports it as ``visioncache_*`` metrics where the engine runs in-process (a
        server's /metrics shows the ``vllm:visioncache_ec_*`` counters instead)."""
        count = self.counters.get
        return self.store.snapshot(
            hits=int(count("hits")),
            misses=int(count("misses")),
            encoded=int(count("encoded_items")),
            seconds_saved=count("seconds_saved"),
        )

    @override
    @classmethod
    def build_ec_connector_stats(cls, data: dict[str, Any] | None = None) -> VisionCacheECStats:
        return VisionCacheECStats(data=dict(data or {}))

    @override
    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> VisionCachePromMetrics:
        return VisionCachePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # ---- worker side -----------------------------------------------------------------------
    @override
    def start_save_caches(self, **kwargs: Any) -> None:
        self._saves.start_step()

    @override
    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs: Any) -> None:
        """Place this step's verified loads on the worker's device, in the encoder's dtype."""
        metadata = self._get_connector_metadata()
        if isinstance(metadata, VisionCacheECMetadata) and metadata.loads:
            device = self._worker_device()
            for identifier, tensor in metadata.loads.items():
                if identifier not in encoder_cache:
                    encoder_cache[identifier] = tensor.to(device=device, dtype=self._dtype)
        self._saves.start_step()  # the encoder runs next

    @override
    def save_caches(self, encoder_cache: dict[str, torch.Tensor], mm_hash: str, **kwargs: Any) -> None:
        """Note the output under the key the scheduler sent for it (none: not saved); it is handed
        to the writer at the end of the step (no waiting here)."""
        metadata = self._connector_metadata
        if not self.is_producer or not isinstance(metadata, VisionCacheECMetadata):
            return
        keyed = metadata.saves.get(mm_hash)
        if keyed is not None and _is_first_tensor_parallel_rank():
            self._saves.note(*keyed, encoder_cache[mm_hash])

    @override
    def build_connector_worker_meta(self) -> WorkerCounts | None:
        """End of the step: queue its saves (`WorkerSaves.end_step`)."""
        return self._saves.end_step()

    def _worker_device(self) -> torch.device:
        if self._device is None:
            from vllm.platforms import current_platform

            name = current_platform.device_type
            if current_platform.is_cuda_alike():
                name = f"{name}:{current_platform.current_device()}"
            self._device = torch.device(name)
        return self._device

    @override
    def shutdown(self) -> None:
        """The worker: every save written or counted as dropped before vLLM's grace period ends
        (`WorkerSaves.shutdown`); the scheduler: close its tiers."""
        if self.role == ECConnectorRole.WORKER:
            self._saves.shutdown(shutdown_seconds())
        else:
            self.store.close()


def _require_inputs_in_the_scheduler(vllm_config: VllmConfig) -> None:
    """Keys are digests of the encoder inputs the scheduler holds; vLLM's shared-memory processor
    cache sends the scheduler only an address."""
    multimodal = getattr(vllm_config.model_config, "multimodal_config", None)
    shared_memory = getattr(multimodal, "mm_processor_cache_type", None) == "shm"
    if shared_memory and getattr(multimodal, "mm_processor_cache_gb", 0) > 0:
        raise ConfigurationError(
            "VisionCacheECConnector keys each item by the encoder inputs the scheduler holds; with "
            "--mm-processor-cache-type shm the scheduler only gets their address: use 'lru' (the default)"
        )


def _is_first_tensor_parallel_rank() -> bool:
    """Every tensor-parallel rank holds the same outputs: only rank 0 writes them."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return bool(get_tensor_model_parallel_rank() == 0)
    except Exception:  # not initialised (single process): the only rank
        return True
