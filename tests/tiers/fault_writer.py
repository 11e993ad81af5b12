"""The writer process of the SIGKILL fault test, and what it writes.

Run as ``python -m tests.tiers.fault_writer SPEC`` (SPEC: JSON naming a disk directory, a Redis
server or a Redis Cluster): it writes entries through a `TierChain`'s background writer, in a loop,
until it is killed, printing after each flush how many entries are stored. It imports no torch, so
it starts in well under a second.
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import numpy as np

from visioncache.tiers.base import Tier
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.redis import RedisTier

# Seconds a tier waits for its storage when no fault is staged: the killed-writer test's premise
# ("flushed means stored, and reads back") must not depend on a 0.25 s socket timeout holding on a
# loaded machine (a 1 MiB write or a multi-MiB MGET timed out there, and read back as a miss).
PATIENT = 10.0


def tier_from_spec(spec: dict[str, Any], timeout: float | None = None) -> Tier:
    """A new tier object on the storage ``spec`` names; ``timeout`` seconds for its storage
    (default: short, as the stall tests want)."""
    if spec["kind"] == "disk":
        return DiskTier(spec["directory"], timeout=timeout or 0.2)
    options = {"socket_timeout": timeout} if timeout else {}
    return RedisTier(spec["url"], key_prefix=spec["prefix"], cluster=spec["kind"] == "cluster", **options)


def entry_key(index: int) -> str:
    return f"00000000000000000000000000000000/embedding/{index:064x}"


def stored_value(index: int) -> np.ndarray:
    """64 KiB to 1 MiB of float32, a function of ``index`` alone (large values take long to write)."""
    size = 16384 * (1 + index % 16)
    return np.random.default_rng(index).standard_normal(size, dtype=np.float32)


def main(spec: dict[str, Any]) -> None:
    chain = TierChain([tier_from_spec(spec, PATIENT)])  # background writes, as a serving process does
    for index in itertools.count():
        chain.save_entry(entry_key(index), stored_value(index), float(index))
        if index % 4 == 3:
            if not chain.flush(timeout=60):
                raise SystemExit("flush timed out")
            print(index + 1, flush=True)  # every entry below this index is stored


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
