"""Each item's encoder-input digest, taken as its request arrives: off the scheduler's critical path.

The connector keys an item by the digest of its processed inputs (`encoder_inputs`). Taken when
vLLM first asks about the item, it would run on the scheduler's thread, between two model steps,
while the workers wait for the next one. vLLM's EngineCore turns each incoming request into its
scheduler ``Request`` in ``preprocess_add_request``, which a server runs on its input thread "in
parallel with model forward" (vllm/v1/engine/core.py, 0.32 and 0.33 alike; an in-process engine
runs it on the caller's thread before adding the request). The connector wraps that method: once
vLLM's own version has filled in each item's inputs (from its processor cache where the frontend
sent none), the wrapper hashes every item and marks the digest on vLLM's feature object, which
the scheduler reads later (`ScheduledItems.digest_of`; an item left unmarked is hashed there).
The request reaches the scheduler's queue only after the wrapper returns, so the scheduler sees
the digest or no mark, never half of one.

What is hashed is what the scheduler holds, as before: the digest is computed by the same
function from the same tensors, only earlier and on another thread. Nothing a client sends is
trusted: vLLM's item identifier (a client's ``uuid`` where one was sent) is neither read nor
replaced. A digest that fails is left unmarked (the scheduler hashes the item itself, counted as
``late_digests``); the request goes on. An engine without this connector is unaffected.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from visioncache.errors import ConfigurationError
from visioncache.integrations.vllm.encoder_inputs import feature_digest

__all__ = ["digest_on_arrival", "hash_on_arrival", "marked_digest"]

logger = logging.getLogger("vllm.visioncache")
_DIGEST = "_visioncache_digest"  # set on a vLLM feature: its encoder-input digest
_MARK = "_visioncache_digests_on_arrival"  # set on the wrapper
_lock = threading.Lock()


def marked_digest(feature: Any) -> bytes | None:
    """The digest marked on ``feature`` as its request arrived; None if it was not hashed then."""
    digest = getattr(feature, _DIGEST, None)
    return digest if isinstance(digest, bytes) else None


def digest_on_arrival(request: Any) -> None:
    """Mark each item of a scheduler ``Request`` with its encoder-input digest (never raises). An
    item without a digest (its inputs not held, a pass-through item) stays unmarked."""
    for feature in getattr(request, "mm_features", None) or ():
        try:
            digest = feature_digest(feature)
        except Exception:  # the scheduler hashes it itself; the request must go on
            logger.exception("VisionCacheECConnector: hashing an item on arrival failed")
            continue
        if digest is not None:
            setattr(feature, _DIGEST, digest)


def _hashes_on_arrival(engine: Any) -> bool:
    connector = getattr(getattr(engine, "scheduler", None), "ec_connector", None)
    return bool(getattr(connector, "hashes_on_arrival", False))


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def preprocess_add_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if _hashes_on_arrival(self):
            request = result[0] if isinstance(result, tuple) else result
            digest_on_arrival(request)
        return result

    setattr(preprocess_add_request, _MARK, True)
    return preprocess_add_request


def hash_on_arrival() -> None:
    """Wrap vLLM's ``EngineCore.preprocess_add_request`` (once per process); ConfigurationError
    if this vLLM has none (the supported releases all do)."""
    from vllm.v1.engine import core

    engine_class = getattr(core, "EngineCore", None)
    original = getattr(engine_class, "preprocess_add_request", None)
    if engine_class is None or not callable(original):
        raise ConfigurationError(
            "VisionCacheECConnector: this vLLM's EngineCore has no preprocess_add_request, where "
            "the connector hashes each item as its request arrives"
        )
    with _lock:
        original = engine_class.__dict__.get("preprocess_add_request", original)
        if not getattr(original, _MARK, False):
            engine_class.preprocess_add_request = _wrap(original)
