"""Engine integrations, one folder per engine (transformers, mlx_vlm, vllm_mlx, vllm) and the
engine-agnostic video package; each folder's ``__init__`` is its face."""
