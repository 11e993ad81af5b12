"""`ScheduledItems`: what the scheduler half knows about the items of the request being scheduled.

vLLM asks ``has_cache_item`` with an item identifier only, right after ``ensure_cache_available``
was called with that item's request. This remembers, from that call, each not-yet-computed item's
request and index, so the identifier leads to the item's encoder input (`encoder_inputs`: the key)
and to the number of embeddings its placeholders expect (a stored entry of another length is never
served). Digests are computed once per request item and forgotten when the request finishes.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from visioncache.integrations.vllm.encoder_inputs import encoder_input_digest

__all__ = ["ScheduledItems"]

# Requests whose item digests are kept; vLLM reports finished requests, this bounds the rest.
_MAX_REQUESTS = 4096
# Items vLLM hands to the model as they are (vLLM 0.33 puts prompt embeddings through the encoder
# cache): no encoder output to keep, nothing to hash.
_PASSTHROUGH = frozenset({"prompt_embeds"})


class ScheduledItems:
    """Identifier -> (request, index) of the request last noted, and each request's digests."""

    def __init__(self) -> None:
        self._current: dict[str, tuple[Any, int]] = {}
        self._digests: OrderedDict[str, dict[int, bytes | None]] = OrderedDict()

    def note_request(self, request: Any, num_computed_tokens: int) -> None:
        """The items of ``request`` that are not computed yet (what vLLM may ask about next)."""
        self._current = {}
        for index, feature in enumerate(request.mm_features):
            position = feature.mm_position
            if position.offset + position.length > num_computed_tokens:
                self._current[feature.identifier] = (request, index)

    def expected_embeds(self, identifier: str) -> int | None:
        located = self._current.get(identifier)
        return None if located is None else int(located[0].get_num_encoder_embeds(located[1]))

    def digest(self, identifier: str) -> bytes | None:
        """The encoder-input digest of the item vLLM asks about; None if unknown or not held."""
        located = self._current.get(identifier)
        return None if located is None else self.digest_of(*located)

    def digest_of(self, request: Any, index: int) -> bytes | None:
        digests = self._digests.get(request.request_id)
        if digests is None:
            digests = self._digests[request.request_id] = {}
            while len(self._digests) > _MAX_REQUESTS:
                self._digests.popitem(last=False)
        if index not in digests:
            feature = request.mm_features[index]
            digests[index] = (
                None
                if feature.modality in _PASSTHROUGH
                else encoder_input_digest(feature.modality, feature.identifier, feature.mm_hash, feature.data)
            )
        return digests[index]

    def finished(self, request_id: str) -> None:
        self._digests.pop(request_id, None)

    def end_step(self) -> None:
        self._current = {}
