"""The cache namespace of an mlx-vlm model and processor: built, parsed, and checked on use."""

from __future__ import annotations

import re
from dataclasses import dataclass

from visioncache import ConfigurationError, VisionEmbeddingCache
from visioncache.integrations.mlx_vlm.families import family_for, family_for_processor
from visioncache.integrations.mlx_vlm.fingerprints import model_fingerprint, processor_fingerprint
from visioncache.integrations.mlx_vlm.protocols import Model, Processor

__all__ = ["NamespaceFields", "cache_namespace", "check_namespace", "parse_namespace"]


def cache_namespace(model_name: str, processor: Processor, model: Model | None = None) -> str:
    """The namespace a cache needs to serve ``prepare_inputs`` (and, with ``model``, features).

    ``model_name`` names the weights (e.g. a repository id and revision): weights are not hashed,
    so two checkpoints of one architecture must be given different names.
    """
    if not isinstance(model_name, str) or not model_name:
        raise ConfigurationError(f"model_name must be a non-empty str, got {model_name!r}")
    family_for_processor(processor)
    namespace = f"mlx-vlm:{model_name};processor={processor_fingerprint(processor)}"
    if model is not None:
        family_for(model, processor)
        namespace += f";model={model_fingerprint(model)}"
    return namespace


@dataclass(frozen=True)
class NamespaceFields:
    """The parts of a namespace built by ``cache_namespace``."""

    model_name: str
    processor: str  # processor_fingerprint(processor)
    model: str | None  # model_fingerprint(model), when the namespace names a model


# The fingerprints are the last fields and hex, so a model name holding ";" or "=" parses unchanged.
_NAMESPACE = re.compile(
    r"mlx-vlm:(?P<name>.+);processor=(?P<processor>[0-9a-f]+)(?:;model=(?P<model>[0-9a-f]+))?"
)


def parse_namespace(namespace: str) -> NamespaceFields | None:
    """The fields of a ``cache_namespace`` result, or None for any other namespace."""
    match = _NAMESPACE.fullmatch(namespace)
    if match is None:
        return None
    return NamespaceFields(match["name"], match["processor"], match["model"])


def check_namespace(cache: VisionEmbeddingCache, processor: Processor, model: Model | None) -> None:
    """Raise ConfigurationError unless ``cache``'s namespace names this processor (and model)."""
    if not cache.enabled:
        return  # nothing is read or stored, so nothing can be served under a wrong identity
    fields = parse_namespace(cache.namespace)
    matches = (
        fields is not None
        and fields.processor == processor_fingerprint(processor)
        and (model is None or fields.model == model_fingerprint(model))
    )
    if not matches:
        raise ConfigurationError(
            f"the cache's namespace {cache.namespace!r} does not name this "
            f"{'model and processor' if model is not None else 'processor'} configuration; "
            "build the cache with VisionEmbeddingCache(namespace="
            "visioncache.integrations.mlx_vlm.cache_namespace(model_name, processor, model))"
        )
