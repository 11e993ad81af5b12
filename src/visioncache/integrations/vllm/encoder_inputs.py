"""What the vision encoder is given for one item, as a digest: the connector's key for the item.

vLLM's item identifier (``mm_hash``) is a hash of the media's bytes, unless the client chose it: a
``multi_modal_uuids`` value (an image part's ``uuid``) becomes the identifier itself, or, when the
request also carries processor or media options, vLLM hashes the client's string with them into a
hex digest that looks like any content hash. Nothing the engine passes to a connector tells the two
apart, and an entry stored under a client's word outlives the request: across restarts and
replicas, any client could name other content with it. So the connector never keys by the
identifier. It keys by the item's processed inputs that the scheduler holds (pixel values, grid
sizes, ...: every field, its name and kind, each tensor's dtype, shape and bytes, framed), hashed
with blake3. Two items share a digest only if the encoder would be given the same input; how the
media was decoded and resized is inside what is hashed. What else shapes the output (the weights, a
LoRA adapter that reaches the encoder, the tenant) is the key's scope, not part of this digest
(`scopes`): in particular the adapter's name, which vLLM writes into the identifier, is never hashed.

One thread, never blake3's own pool: the digest is taken on vLLM's input thread as a request
arrives (`arrival_digests`), next to vLLM's workers; a pool of its own would compete with them for
the cores (4.8 MB of pixel values hash in about 1.4 ms on one core here).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import torch
from blake3 import blake3

from visioncache.identity import domain_key, frame

__all__ = ["PASSTHROUGH", "encoder_input_digest", "feature_digest"]

_DOMAIN = domain_key("visioncache/vllm-encoder-input/v2")
# Items vLLM hands to the model as they are (vLLM 0.33 puts prompt embeddings through the encoder
# cache): no encoder output to keep, nothing to hash.
PASSTHROUGH = frozenset({"prompt_embeds"})


def feature_digest(feature: Any) -> bytes | None:
    """The digest of a vLLM multimodal feature's encoder input (`encoder_input_digest`); None for
    a pass-through item or an input the scheduler does not hold."""
    if feature.modality in PASSTHROUGH:
        return None
    return encoder_input_digest(feature.modality, feature.data)


def encoder_input_digest(modality: str, data: Any) -> bytes | None:
    """The 32-byte digest of one item's encoder input; None when the scheduler does not hold it
    (its payload lives elsewhere, e.g. vLLM's shared-memory processor cache)."""
    if not isinstance(data, Mapping) or not data:
        return None
    hasher = blake3(key=_DOMAIN)  # one thread (module docstring)
    hasher.update(frame(modality.encode()))
    for name in sorted(data):
        element = data[name]
        tensors = getattr(element, "data", None)
        if tensors is None:
            return None
        kind = type(getattr(element, "field", None)).__name__  # batched, flat or shared
        hasher.update(frame(str(name).encode()) + frame(kind.encode()))
        if not _update(hasher, tensors):
            return None
    digest: bytes = hasher.digest()
    return digest


def _update(hasher: Any, value: object) -> bool:
    """Feed a nested tensor (a tensor, or lists and tuples of them) to ``hasher``; False for
    anything else."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.device.type != "cpu":
            return False
        shape = struct.pack(f"<Q{tensor.ndim}Q", tensor.ndim, *tensor.shape)
        hasher.update(b"t" + frame(str(tensor.dtype).encode()) + shape)
        flat = tensor.contiguous().reshape(-1)
        if flat.numel():
            hasher.update(flat.view(torch.uint8).numpy().data)
        return True
    if isinstance(value, list | tuple):
        hasher.update(b"l" + struct.pack("<Q", len(value)))
        return all(_update(hasher, item) for item in value)
    return False
