"""A disk tier slower than a shutdown's deadline: each write sleeps ``VISIONCACHE_TEST_SLOW_WRITES``
seconds first (in every process of a server the tests start, through ``site/sitecustomize.py``)."""

from __future__ import annotations

import os
import time
from typing import Any

ENV = "VISIONCACHE_TEST_SLOW_WRITES"


def install() -> None:
    from visioncache.tiers.disk import DiskTier

    seconds = float(os.environ[ENV])
    original = DiskTier.put

    def slow_put(self: Any, key: str, blob: bytes) -> None:
        if "/vllm-ec/" in key:  # entries, not the namespace record
            time.sleep(seconds)
        original(self, key, blob)

    DiskTier.put = slow_put  # type: ignore[method-assign]
