"""The ``visioncache`` command line: ``bench``, ``stats``, ``purge`` and ``serve-mlx``.

Each subcommand lives in its own module under ``visioncache.commands`` and exposes
``add_parser(subparsers)`` and ``run(args) -> int``; this module only dispatches, and imports a
subcommand's module (and its heavy dependencies) only when that subcommand runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import TypeAlias

from visioncache.errors import VisionCacheError

# What ``ArgumentParser.add_subparsers`` returns, for each command's ``add_parser`` (argparse
# names its class privately).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
# subcommand name -> module under visioncache.commands
SUBCOMMANDS = {"bench": "bench", "stats": "stats", "purge": "purge", "serve-mlx": "serve_mlx"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="visioncache", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBCOMMANDS.values():
        module = importlib.import_module(f"visioncache.commands.{module_name}")
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(f"visioncache.commands.{SUBCOMMANDS[args.command]}")
    try:
        return int(module.run(args))
    except VisionCacheError as error:
        print(f"visioncache {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
