"""visioncache inside vllm-mlx's OpenAI server (continuous-batching MLLM engine), for every model
family mlx-vlm runs that `visioncache.integrations.mlx_vlm.families` describes and a self-check on
the loaded model proves exact (docs/families.md lists them); any other model runs vllm-mlx's code.

Run the server with ``visioncache serve-mlx MODEL [vllm-mlx serve flags] [--vision-cache-* flags]``
(``visioncache.commands.serve_mlx``; ``python -m visioncache serve-mlx ...`` is the same); embed it
with `install`. What changes inside the engine:

- its vision cache is a configured visioncache, namespaced by the weights, the model
  configuration and the processor, sized and tiered (disk, Redis) by the flags;
- per scheduler step, the images of all image requests are looked up together and the missing
  ones (deduplicated across requests) are encoded in ONE vision-tower call; the model gets the
  features through mlx-vlm's ``cached_image_features``, so a cached image is not decoded,
  preprocessed or encoded again;
- its KV prefix cache (text-only prompts in vllm-mlx) also serves image prompts, keyed with
  image-aware ids (`kv_keys`): turn N+1 of an image chat reuses turn N's KV and prefills only the
  new tail, from the cached features, at the right rotary positions.

Exactly vllm-mlx ``SUPPORTED_VLLM_MLX_VERSION`` is supported; `compat.SEAMS` lists every vllm-mlx
name used, and `install` what each patch does.
"""

from __future__ import annotations

from visioncache.integrations.vllm_mlx.compat import SUPPORTED_VLLM_MLX_VERSION
from visioncache.integrations.vllm_mlx.install import Installation, install, installed
from visioncache.integrations.vllm_mlx.launcher import serve
from visioncache.integrations.vllm_mlx.settings import VisionCacheSettings
from visioncache.integrations.vllm_mlx.stats import EngineStats

__all__ = [
    "SUPPORTED_VLLM_MLX_VERSION",
    "EngineStats",
    "Installation",
    "VisionCacheSettings",
    "install",
    "installed",
    "serve",
]
