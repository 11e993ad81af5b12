"""Array trees: sizes and container copies; byte-size strings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from visioncache import ConfigurationError
from visioncache.trees import copy_containers, parse_byte_size, tree_nbytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 * 2**20),
        ("2GiB", 2 * 2**30),
        ("1.5GB", 1_500_000_000),
        ("10", 10),
        ("64k", 65536),
        (4096, 4096),
        (None, None),
    ],
)
def test_parse_byte_size(text, expected):
    assert parse_byte_size(text) == expected


@pytest.mark.parametrize("bad", ["2 parsecs", "-1GiB", "", -5, 1.5, True])
def test_parse_byte_size_rejects_nonsense(bad):
    with pytest.raises(ConfigurationError):
        parse_byte_size(bad, name="max_bytes")


def test_tree_nbytes_walks_containers_and_dataclasses():
    @dataclass
    class Holder:
        first: object
        second: object

    tree = {"a": [np.zeros(10, np.uint8), (np.zeros(3, np.float64), 5, None)], "b": Holder(b"abcd", 2.0)}
    assert tree_nbytes(tree) == 10 + 24 + 4


def test_copy_containers_shares_arrays_and_copies_containers():
    array = np.zeros(3)
    tree = {"x": [array, {"y": 1}]}
    copied = copy_containers(tree)
    assert copied == tree and copied["x"][0] is array
    copied["x"][1]["y"] = 2
    assert tree["x"][1]["y"] == 1
