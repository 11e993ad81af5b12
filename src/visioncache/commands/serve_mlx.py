"""``visioncache serve-mlx MODEL [vllm-mlx serve flags] [--vision-cache-* flags]``: vllm-mlx's OpenAI
server with visioncache installed (see `visioncache.integrations.vllm_mlx`)."""

from __future__ import annotations

import argparse

from visioncache.cli import Subparsers

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve-mlx",
        help="vllm-mlx's OpenAI server with visioncache (pip install 'visioncache[vllm-mlx]')",
        add_help=False,  # --help goes to the launcher, which lists the visioncache flags
    )
    parser.add_argument("-h", "--help", dest="launcher_help", action="store_true")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, metavar="MODEL [flags]")


def run(args: argparse.Namespace) -> int:
    from visioncache.integrations.vllm_mlx.launcher import serve

    return serve(["--help"] if args.launcher_help else args.serve_args)
