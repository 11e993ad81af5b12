"""`ScheduledItems`: what the scheduler half knows about the items of the request being scheduled.

vLLM asks ``has_cache_item`` with an item identifier only, right after ``ensure_cache_available``
was called with that item's request. This remembers, from that call, each not-yet-computed item's
request and index, so the identifier leads to the item's encoder input (`encoder_inputs`: the
digest), its scope (`item_store.Scope`: adapter and tenant, decided once per request) and the
number of embeddings its placeholders expect (a stored entry of another length is never served).
Digests are taken as each request arrives, on vLLM's input thread (`arrival_digests`); an item
that arrived without one is hashed here, on the scheduler's thread, and counted
(``late_digests``). Either way once per request item, forgotten when the request finishes.

vLLM's own encoder cache keys an item by its identifier alone, across tenants, adapters reloaded
under one name and weight updates. So the first time an item is seen, before vLLM decides anything
about it, its identifier is prefixed with its scope's tag (``scope_prefix``): vLLM's cache then
keeps tenants, adapters and weight epochs apart too, and a tenant's first request for an image
another tenant sent costs an encode, as it would on a server of its own. The prefix is applied
once per item (marked on vLLM's feature object), so vLLM's bookkeeping never sees an identifier
change under it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from visioncache.integrations.vllm.arrival_digests import marked_digest
from visioncache.integrations.vllm.encoder_inputs import PASSTHROUGH, feature_digest
from visioncache.integrations.vllm.item_store import Scope

__all__ = ["ScheduledItems"]

# Requests whose item digests are kept; vLLM reports finished requests, this bounds the rest.
_MAX_REQUESTS = 4096
_SCOPED = "_visioncache_scoped"  # set on a vLLM feature whose identifier carries its scope


@dataclass
class _Request:
    scope: Scope | None  # None: its items cannot be keyed (an adapter of unknown content)
    digests: dict[int, bytes | None] = field(default_factory=dict)


class ScheduledItems:
    """Identifier -> (request, index) of the request last noted, and each request's scope and digests.

    Args:
        scope_of: a request's scope, or None when its items must not be keyed.
        scope_prefix: the prefix of an identifier in that scope ("" for none).
        count: adds to one of the connector's counters (``late_digests``).
    """

    def __init__(
        self,
        scope_of: Callable[[Any], Scope | None],
        scope_prefix: Callable[[Scope | None], str],
        count: Callable[[str, float], None],
    ) -> None:
        self._scope_of = scope_of
        self._scope_prefix = scope_prefix
        self._count = count
        self._current: dict[str, tuple[Any, int]] = {}
        self._requests: OrderedDict[str, _Request] = OrderedDict()

    def _request(self, request: Any) -> _Request:
        tracked = self._requests.get(request.request_id)
        if tracked is None:
            tracked = self._requests[request.request_id] = _Request(self._scope_of(request))
            while len(self._requests) > _MAX_REQUESTS:
                self._requests.popitem(last=False)
        return tracked

    def note_request(self, request: Any, num_computed_tokens: int) -> None:
        """The items of ``request`` that are not computed yet (what vLLM may ask about next);
        items seen for the first time get their scope's identifier."""
        tracked = self._request(request)
        prefix: str | None = None
        self._current = {}
        for index, feature in enumerate(request.mm_features):
            if not getattr(feature, _SCOPED, False):
                if prefix is None:
                    prefix = self._scope_prefix(tracked.scope)
                feature.identifier = prefix + feature.identifier
                setattr(feature, _SCOPED, True)
            position = feature.mm_position
            if position.offset + position.length > num_computed_tokens:
                self._current[feature.identifier] = (request, index)

    def expected_embeds(self, identifier: str) -> int | None:
        located = self._current.get(identifier)
        return None if located is None else int(located[0].get_num_encoder_embeds(located[1]))

    def located(self, identifier: str) -> tuple[Any, int] | None:
        """The (request, index) of the item vLLM asks about, if it was just noted."""
        return self._current.get(identifier)

    def scope(self, request: Any) -> Scope | None:
        return self._request(request).scope

    def digest_of(self, request: Any, index: int) -> bytes | None:
        """The encoder-input digest of a request's item; None if its input is not held here."""
        digests = self._request(request).digests
        if index not in digests:
            feature = request.mm_features[index]
            digest = None if feature.modality in PASSTHROUGH else marked_digest(feature)
            if digest is None and feature.modality not in PASSTHROUGH:
                self._count("late_digests", 1)  # not hashed on arrival: here, on the scheduler's thread
                digest = feature_digest(feature)
            digests[index] = digest
        return digests[index]

    def finished(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def end_step(self) -> None:
        self._current = {}
