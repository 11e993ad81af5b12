"""``visioncache serve-mlx MODEL [vllm-mlx serve flags] [--vision-cache-* flags]``: vllm-mlx's OpenAI
server, started in this process with the integration installed.

The ``--vision-cache-*`` flags are taken out; everything else is parsed by vllm-mlx's own ``serve``
parser and run by its own ``serve_command``. Settings the integration cannot serve exactly are
refused before the server answers anything: another vllm-mlx or mlx-vlm version; a model family
without a family description (read from the model's ``config.json``, a local directory's or a
repository's, before loading; and again on the loaded model at server start, where the family's
self-check runs: `VisionCacheSettings.refuse_unsupported`); media SpecPrefill (it reads pixels
the cached path does not have); a multi-model config; and serving without
``--continuous-batching`` (the simple engine has no scheduler step to batch).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from visioncache import ConfigurationError
from visioncache.integrations.mlx_vlm import check_mlx_vlm_version
from visioncache.integrations.mlx_vlm.families import family_for_model_type
from visioncache.integrations.vllm_mlx.compat import checked_module, import_batch_generator_module
from visioncache.integrations.vllm_mlx.handle_api import mount
from visioncache.integrations.vllm_mlx.install import install
from visioncache.integrations.vllm_mlx.settings import VisionCacheSettings, add_arguments, weights_identity
from visioncache.integrations.vllm_mlx.tenants import mount as mount_tenants

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


def model_config(model: str, *, offline: bool) -> dict[str, object] | None:
    """The ``config.json`` of a local model directory or of a repository id (from the Hugging Face
    cache, or the Hub unless ``offline``); None when it cannot be read before loading."""
    local = Path(model) / "config.json"
    if local.is_file():
        config: dict[str, object] = json.loads(local.read_text())
        return config
    if Path(model).exists():
        return None
    try:
        from huggingface_hub import hf_hub_download

        config = json.loads(Path(hf_hub_download(model, "config.json", local_files_only=offline)).read_text())
    except Exception:  # unreachable here: checked on the loaded model at server start instead
        return None
    return config


def check_model_type(model: str, model_type: object) -> None:
    """Refuse a model family visioncache cannot serve in vllm-mlx, with the reason."""
    try:
        family_for_model_type(model_type)
    except ConfigurationError as error:
        raise ConfigurationError(f"{model}: {error}") from None


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
    config = model_config(args.model, offline=getattr(args, "offline", False))
    if config is not None:
        check_model_type(args.model, config.get("model_type"))


def serve(argv: Sequence[str]) -> int:
    """Parse ``argv`` (MODEL and flags), install the integration, run vllm-mlx's server until it stops."""
    ours, rest = build_parser().parse_known_args(list(argv))
    import_batch_generator_module()  # the version checks, before vllm-mlx's parser is even built
    check_mlx_vlm_version()
    cli = checked_module("vllm_mlx.cli")

    args = cli.create_parser().parse_args(["serve", *rest])
    _check_serve_args(args)
    # The user asked for the cache: a model it cannot serve fails the start (embedded, stock runs it).
    settings = replace(VisionCacheSettings.from_args(ours, model_path=args.model), refuse_unsupported=True)
    if (settings.tenants_file or settings.tenants_env) and getattr(args, "api_key", None):
        raise ConfigurationError(
            "--api-key and tenants by API key (--vision-cache-tenants-file/-env) exclude each other: "
            "the tenants' keys are the server's keys"
        )
    weights_identity(settings)  # read the weights now: a bad path fails here, not on a request
    installation = install(settings)
    server = checked_module("vllm_mlx.server")

    if installation.handles is not None:
        mount(server.app, installation)  # the upload and delete routes and the handle check
    if installation.tenants is not None:
        # last: the outermost middleware
        installation.verify_api_key = mount_tenants(server.app, installation.tenants)
    try:
        cli.serve_command(args)
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it has already handled by shutting the server down
    finally:
        installation.close()
        installation.uninstall()
    return 0
