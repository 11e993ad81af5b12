"""fingerprint.py: framed parts, stable JSON, and one weights digest for every engine integration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from visioncache.integrations.fingerprint import fingerprint, stable_json, weights_digest


def test_parts_are_framed_and_json_is_stable() -> None:
    assert fingerprint(["ab", "c"]) != fingerprint(["a", "bc"])
    assert fingerprint(["x"], hex_chars=32) == fingerprint(["x"])[:32]
    assert stable_json({"b": 1, "a": object()}) == stable_json({"a": object(), "b": 1})
    with pytest.raises(ValueError):
        fingerprint(["x"], hex_chars=16)  # under 128 bits


def test_weights_digest_follows_every_weight_file(tmp_path: Path) -> None:
    assert weights_digest(tmp_path) is None and weights_digest(tmp_path / "absent") is None
    (tmp_path / "config.json").write_text("{}")
    assert weights_digest(tmp_path) is None  # a config is not weights
    shard = tmp_path / "sub" / "model-00001.safetensors"
    shard.parent.mkdir()
    shard.write_bytes(b"\x00" * 4096)
    first = weights_digest(tmp_path)
    assert first is not None and weights_digest(tmp_path) == first
    shard.write_bytes(b"\x00" * 4095 + b"\x01")  # same size, other bytes
    os.utime(shard, ns=(1, 1))  # a new file state, so the memo is not consulted
    assert weights_digest(tmp_path) not in (None, first)
    assert weights_digest(tmp_path, (".npz",)) is None  # only the suffixes asked for
