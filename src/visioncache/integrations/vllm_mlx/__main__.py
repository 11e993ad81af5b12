"""``python -m visioncache.integrations.vllm_mlx serve MODEL [flags]``, as ``visioncache serve-mlx``."""

from __future__ import annotations

import sys

from visioncache import VisionCacheError
from visioncache.integrations.vllm_mlx.launcher import serve


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print("usage: python -m visioncache.integrations.vllm_mlx serve MODEL [flags]", file=sys.stderr)
        return 2
    try:
        return serve(argv[1:])
    except VisionCacheError as error:
        print(f"visioncache serve-mlx: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
