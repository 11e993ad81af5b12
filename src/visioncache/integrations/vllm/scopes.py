"""`Scopes`: what besides its encoder input keys an item, decided by the scheduler half.

- **Tenant**: a request's ``cache_salt`` (vLLM's per-request secret for its prefix cache) keys
  its items' entries like a visioncache salt, so two tenants sending one image share no entry and
  cannot tell from their tier keys which images another sent. ``ignore_cache_salt`` in the
  configuration puts every request in one shared, public namespace instead.
- **Adapter**: with ``--enable-tower-connector-lora`` a request's LoRA adapter reaches the encoder;
  it scopes the request's items by its content digest (`adapters`), never its name or path.
- **Weight epoch**: the store's current namespace (`ItemStore.new_epoch`), moved whenever the
  engine reports an event that may have changed the weights (`engine_events`).

The scope's tag also prefixes vLLM's own identifier of each item (`scheduled_items`), so vLLM's
encoder cache keeps them apart as well.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from visioncache.integrations.vllm.adapters import AdapterIdentities
from visioncache.integrations.vllm.engine_events import changes_weights
from visioncache.integrations.vllm.item_store import ItemStore, Scope

__all__ = ["Scopes"]

logger = logging.getLogger("vllm.visioncache")


class Scopes:
    """The scheduler's scoping of items (see the module docstring).

    Args:
        store: the connector's store (its key builders and weight epoch).
        ignore_cache_salt: one shared namespace for every request, whatever its ``cache_salt``.
        adapters_reach_the_encoder: vLLM applies LoRA adapters to the tower and connector.
    """

    def __init__(
        self, store: ItemStore, *, ignore_cache_salt: bool, adapters_reach_the_encoder: bool
    ) -> None:
        self.store = store
        self.ignore_cache_salt = ignore_cache_salt
        self.adapters = AdapterIdentities() if adapters_reach_the_encoder else None

    def scope_of(self, request: Any) -> Scope | None:
        """A request's scope; None when its adapter's content cannot be known (no key then)."""
        tenant = None if self.ignore_cache_salt else (getattr(request, "cache_salt", None) or None)
        lora_request = getattr(request, "lora_request", None)
        if self.adapters is None or lora_request is None:
            return Scope(tenant=tenant)
        adapter = self.adapters.digest(lora_request)
        return None if adapter is None else Scope(adapter=adapter, tenant=tenant)

    def prefix(self, scope: Scope | None) -> str:
        """The identifier prefix of ``scope`` in vLLM's own encoder cache: none for the default
        scope of the start-up weights, a random one (shared with nothing) for an unkeyed scope."""
        if scope is None:
            return f"vc-unkeyed-{secrets.token_hex(16)}:"
        if scope == Scope() and self.store.epoch == 0:
            return ""
        return f"vc-{self.store.tag(scope)}:"

    def observe(self, event: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """An EngineCore event (`engine_events`): an adapter (re)loaded, or weights that may have
        changed, which starts a new weight epoch. True when it did."""
        if event == "add_lora":
            if self.adapters is not None and args:
                self.adapters.loaded(args[0])
            return False
        if not changes_weights(event, args, kwargs):
            return False
        namespace = self.store.new_epoch()
        logger.warning(
            "VisionCacheECConnector: %s may have changed the model's weights; encoder outputs are "
            "now read and written in a new namespace (%s): nothing stored before is served again",
            event,
            namespace,
        )
        return True

    def log_tenancy(self) -> None:
        """Say once, at start-up, who shares entries: the tiers outlive the process and cross
        replicas."""
        if self.ignore_cache_salt:
            logger.warning(
                "VisionCacheECConnector: ignore_cache_salt is set: ALL CLIENTS SHARE ONE CACHE. Any "
                "client can learn whether another sent an image (a hit answers sooner than an encode), "
                "on this server, after a restart and on every replica of its tiers. Give each tenant "
                "a cache_salt and remove ignore_cache_salt to keep them apart."
            )
        else:
            logger.info(
                "VisionCacheECConnector: a request's cache_salt is its tenant (its entries are shared "
                "with no other salt); requests without one share one cache"
            )
