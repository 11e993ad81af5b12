"""Blobs as anyone who can write to an unsigned tier could make them: a valid digest over any file."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from visioncache.tiers import serialization, tensor_file

__all__ = ["forge", "forged_tree", "forged_tree_text", "nested_header_file"]


def forge(file: bytes, context: str = "", secret: bytes | None = None) -> bytes:
    """``file`` (any bytes, meant as a safetensors file) framed as a blob with a valid digest."""
    return serialization.MAGIC + serialization._digest(secret, context, [file]) + file


def forged_tree(
    skeleton: Any,
    *,
    version: str = str(serialization.FORMAT_VERSION),
    arrays: dict[str, np.ndarray[Any, Any]] | None = None,
    context: str = "",
) -> bytes:
    """A blob whose skeleton and arrays the forger chose, with a valid unkeyed digest."""
    return forged_tree_text(json.dumps(skeleton), version=version, arrays=arrays, context=context)


def forged_tree_text(
    skeleton: str,
    *,
    version: str = str(serialization.FORMAT_VERSION),
    arrays: dict[str, np.ndarray[Any, Any]] | None = None,
    context: str = "",
) -> bytes:
    """The same with the skeleton's JSON text as given (it need not parse)."""
    metadata = {"format": serialization.FORMAT, "version": version, "auth": "none", "skeleton": skeleton}
    return forge(b"".join(tensor_file.pack(arrays or {}, metadata)), context)


def nested_header_file(depth: int = 200_000) -> bytes:
    """A safetensors file whose JSON header is ``depth`` nested ``[``: it overflows a recursive parser."""
    header = b"[" * depth
    return len(header).to_bytes(8, "little") + header
