"""`VerifiedItems`: encoder outputs the scheduler has read and verified, held until a step ships them.

Between vLLM's ``has_cache_item`` (answered yes) and ``update_state_after_alloc`` (the item is
scheduled) the tensor waits here; one that is not scheduled (its request was not admitted this
step) stays for a later step, least recently used first out beyond the byte budget.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

__all__ = ["VerifiedItems"]


class VerifiedItems:
    """Tier key -> verified tensor, bounded in bytes (the newest entry is always kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.nbytes = 0

    def touch(self, identifier: str) -> bool:
        """Whether ``identifier`` is held (and mark it recently used)."""
        if identifier not in self._items:
            return False
        self._items.move_to_end(identifier)
        return True

    def put(self, identifier: str, tensor: torch.Tensor) -> None:
        self.pop(identifier)
        self._items[identifier] = tensor
        self.nbytes += tensor.nbytes
        while self.nbytes > self.max_bytes and len(self._items) > 1:
            _, dropped = self._items.popitem(last=False)
            self.nbytes -= dropped.nbytes

    def pop(self, identifier: str) -> torch.Tensor | None:
        tensor = self._items.pop(identifier, None)
        if tensor is not None:
            self.nbytes -= tensor.nbytes
        return tensor

    def clear(self) -> None:
        """Drop every held tensor (a new weight epoch: none may be served)."""
        self._items.clear()
        self.nbytes = 0
