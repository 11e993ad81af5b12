"""``visioncache serve-mlx MODEL [vllm-mlx serve flags] [--vision-cache-* flags]``: vllm-mlx's OpenAI
server, started in this process with the integration installed.

The ``--vision-cache-*`` flags are taken out; everything else is parsed by vllm-mlx's own ``serve``
parser and run by its own ``serve_command``. Settings the integration cannot serve exactly are
refused before anything starts: another vllm-mlx version, a model family whose cached features
are not exact (Qwen3-VL), media SpecPrefill (it reads pixels the cached path does not have), a
multi-model config, and serving without ``--continuous-batching`` (the simple engine has no
scheduler step to batch).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from visioncache import ConfigurationError
from visioncache.integrations.mlx_vlm import SUPPORTED_MODEL_TYPES
from visioncache.integrations.vllm_mlx.compat import import_batch_generator_module
from visioncache.integrations.vllm_mlx.install import install
from visioncache.integrations.vllm_mlx.settings import VisionCacheSettings, add_arguments, weights_identity

__all__ = ["build_parser", "serve"]


def build_parser() -> argparse.ArgumentParser:
    """The launcher's own flags; vllm-mlx's ``serve`` flags pass through (``vllm-mlx serve --help``)."""
    parser = argparse.ArgumentParser(
        prog="visioncache serve-mlx",
        usage="%(prog)s MODEL [vllm-mlx serve flags] [--vision-cache-* flags]",
        description="vllm-mlx's OpenAI server with visioncache: per-image vision features, one "
        "batched tower call per scheduler step, and image-aware KV prefix reuse. "
        "Any other flag is vllm-mlx's (see `vllm-mlx serve --help`).",
    )
    add_arguments(parser)
    return parser


def _check_model_directory(model: str) -> None:
    config_path = Path(model) / "config.json"
    if not config_path.is_file():
        return  # a repository id: vllm-mlx resolves it; the family is checked when it loads
    model_type = json.loads(config_path.read_text()).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigurationError(
            f"{model}: model type {model_type!r} is not supported by visioncache's vllm-mlx "
            f"integration (supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}); Qwen3-VL is refused "
            "because mlx-vlm's cached_image_features drops its deepstack features"
        )


def _check_serve_args(args: argparse.Namespace) -> None:
    if not args.model:
        raise ConfigurationError("MODEL is required: visioncache serve-mlx MODEL [flags]")
    if getattr(args, "models_config", None):
        raise ConfigurationError("visioncache serve-mlx serves one MODEL; --models-config is not supported")
    if not args.continuous_batching:
        raise ConfigurationError(
            "visioncache serve-mlx needs --continuous-batching (the batched MLLM engine it extends)"
        )
    if getattr(args, "specprefill", False):
        raise ConfigurationError("--specprefill reads pixel values; it cannot run on cached vision features")
    _check_model_directory(args.model)


def serve(argv: Sequence[str]) -> int:
    """Parse ``argv`` (MODEL and flags), install the integration, run vllm-mlx's server until it stops."""
    ours, rest = build_parser().parse_known_args(list(argv))
    import_batch_generator_module()  # the version check, before vllm-mlx's parser is even built
    from vllm_mlx import cli

    args = cli.create_parser().parse_args(["serve", *rest])
    _check_serve_args(args)
    settings = VisionCacheSettings.from_args(ours, model_path=args.model)
    weights_identity(settings)  # read the weights now: a bad path fails here, not on a request
    installation = install(settings)
    try:
        cli.serve_command(args)
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it has already handled by shutting the server down
    finally:
        installation.close()
        installation.uninstall()
    return 0
