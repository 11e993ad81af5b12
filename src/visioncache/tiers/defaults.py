"""The shared tiers' defaults, stated once: `TierSettings` and the tier constructors read them here."""

from __future__ import annotations

__all__ = [
    "DISK_TIMEOUT",
    "MAX_PENDING_WRITE_BYTES",
    "REDIS_PREFIX",
    "REDIS_TIMEOUT",
    "RETRY_INTERVAL",
]

DISK_TIMEOUT = 1.0  # seconds an operation waits for another process's SQLite lock
REDIS_PREFIX = "visioncache:"  # prefix of every Redis key
REDIS_TIMEOUT = 0.25  # seconds per Redis operation (connect included)
RETRY_INTERVAL = 5.0  # seconds a failed tier is skipped before it is tried again
MAX_PENDING_WRITE_BYTES = 256 * 2**20  # background writes queued at most (0: on the caller's thread)
