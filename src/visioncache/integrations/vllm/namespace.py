"""The namespace of the connector's keys: what shapes an encoder output beyond its input.

A key digests what the encoder is given for an item (`encoder_inputs`); the output also depends on
the model, which vLLM names only by a path or a repository id. Two servers sharing one Redis could
serve different weights under one name, or one model in two dtypes. So every key also carries a
namespace built from the weights' content (every weight file, hashed with blake3), the model and
processor configuration, the dtype, vLLM's hash algorithm and the vLLM, transformers and torch
versions (decoding, processors and kernels change outputs: vLLM 0.33 decodes RGB images with
transparency differently from 0.32). Equal deployments derive equal namespaces on every host and
across restarts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from visioncache.errors import ConfigurationError
from visioncache.integrations.fingerprint import fingerprint, stable_json
from visioncache.integrations.fingerprint import weights_digest as fingerprint_weights

__all__ = ["VALUE_FORMAT", "engine_namespace", "namespace_for", "weights_digest"]

# Bump when the layout of a stored encoder output, or what its key digests, changes
# (v2: keys are encoder-input digests, no longer vLLM's item identifiers; v3: an adapter keys by its
# content, not its name, a request by its tenant, the weights by their epoch).
VALUE_FORMAT = "visioncache.vllm-ec/v3"
_CONFIG_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def weights_digest(directory: str | os.PathLike[str]) -> str:
    """`visioncache.integrations.fingerprint.weights_digest` of the model directory; a clear start-up error
    when it holds no weight files."""
    digest = fingerprint_weights(directory)
    if digest is None:
        raise ConfigurationError(
            f"VisionCacheECConnector: no weight files under {str(directory)!r} to derive the cache "
            "namespace from; set 'namespace' in ec_connector_extra_config to name the weights yourself"
        )
    return digest


def _processor_files(directory: Path) -> Iterable[str]:
    for name in _CONFIG_FILES:
        path = directory / name
        yield f"{name}={path.read_text() if path.is_file() else ''}"


def namespace_for(
    *,
    model_directory: str | os.PathLike[str],
    model_config_json: str,
    processor_kwargs_json: str,
    dtype: str,
    hash_algorithm: str,
    engine_version: str,
) -> str:
    """``vllm-ec/<fingerprint>``: readable prefix, 256-bit fingerprint of everything above."""
    directory = Path(model_directory)
    parts = [
        VALUE_FORMAT,
        f"weights={weights_digest(directory)}",
        f"config={model_config_json}",
        f"processor_kwargs={processor_kwargs_json}",
        *_processor_files(directory),
        f"dtype={dtype}",
        f"mm_hash_algorithm={hash_algorithm}",
        f"vllm={engine_version}",
    ]
    return f"vllm-ec/{fingerprint(parts)}"


def model_directory(model_config: Any) -> str:
    """The local directory of vLLM's ``--model`` (a path, or a repository in the local HF cache)."""
    model = str(model_config.model)
    if os.path.isdir(model):
        return model
    from huggingface_hub import snapshot_download

    return str(snapshot_download(model, revision=model_config.revision, local_files_only=True))


def engine_namespace(vllm_config: Any, engine_versions: str) -> str:
    """The namespace of a vLLM deployment, from its ``VllmConfig`` and the engine's versions."""
    model_config = vllm_config.model_config
    hf_config = model_config.hf_config.to_dict()
    for volatile in ("_name_or_path", "transformers_version"):
        hf_config.pop(volatile, None)
    return namespace_for(
        model_directory=model_directory(model_config),
        model_config_json=stable_json(hf_config),
        processor_kwargs_json=stable_json(model_config.mm_processor_kwargs or {}),
        dtype=str(model_config.dtype),
        hash_algorithm=str(getattr(model_config.multimodal_config, "mm_hasher_algorithm", "blake3")),
        engine_version=engine_versions,
    )
