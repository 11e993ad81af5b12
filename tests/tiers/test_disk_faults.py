"""Regression testsdisk-tier faults that lost data silently or leaked space.

- The directory deleted at run time (or deleted and recreated by another process): the tier kept
  writing into the deleted, still-open database, counting 20 writes as successes with 0 errors,
  and a restarted cache found none of them. A write now checks that the directory's database is
  still the one the tier opened, and reopens it if not; reads check at most once per
  ``check_interval``; a write whose database was replaced while it ran is counted as a failure.
- A write that fails (EFBIG, ENOSPC, a database error after the value file was written) left its
  partial value file behind, outside ``max_bytes`` (16 failed 2 MiB writes: 16 MiB of orphans).
  Now the file is removed and the failure raised (the chain counts it).
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diskcache
import numpy as np
import pytest

from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import BytesOnlyDisk, DiskTier

TAG = "0123456789abcdef"
LARGE = 2 * 2**20  # bytes: stored as a value file, not inside SQLite


def key(index: int) -> str:
    return f"{TAG}/embedding/{index:064x}"


def value(index: int) -> np.ndarray:
    return np.full(64, index, np.float32)


def value_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.val"))


def reads_back(directory: Path, indices: range) -> int:
    """How many of these entries a fresh process's tier (a restart) finds, correct."""
    chain = TierChain([DiskTier(directory)], max_pending_write_bytes=0)
    found = chain.load_many([key(index) for index in indices])
    chain.close()
    return sum(
        item is not None and np.array_equal(item, value(index))
        for item, index in zip(found, indices, strict=True)
    )


@pytest.mark.parametrize("recreated", [False, True], ids=["deleted", "deleted-and-recreated"])
def test_regression_writes_after_the_directory_is_deleted_are_lost_silently(
    tmp_path: Path, recreated: bool
) -> None:
    directory = tmp_path / "disk"
    chain = TierChain([DiskTier(directory)], max_pending_write_bytes=0)
    for index in range(5):
        assert chain.save(key(index), value(index))
    shutil.rmtree(directory)
    if recreated:  # another process's tier starts over in the same place
        other = DiskTier(directory)
        other.put("another process's key", b"its bytes")
        other.close()
    stored = [chain.save(key(index), value(index)) for index in range(100, 120)]
    stats = chain.stats().tier("disk")
    assert stats.errors == 0 and all(stored)
    assert reads_back(directory, range(100, 120)) == 20  # a restart finds every write counted as stored
    assert chain.stats().tier("disk").reopens == 1
    if recreated:
        assert DiskTier(directory).get("another process's key") == b"its bytes"  # not clobbered
    chain.close()


def test_reads_see_a_recreated_directory_within_one_check_interval(tmp_path: Path) -> None:
    """A reader whose directory was deleted and recreated by another process finds that
    process's entries after at most one ``check_interval`` (here on a fake clock)."""
    now = [100.0]
    directory = tmp_path / "disk"
    reader = DiskTier(directory, check_interval=5.0, clock=lambda: now[0])
    assert reader.get(key(1)) is None  # opened
    shutil.rmtree(directory)
    writer = DiskTier(directory)
    writer.put(key(1), b"written by the other process")
    assert reader.get(key(1)) is None  # within the interval: the deleted database answers
    now[0] += 5.0
    assert reader.get(key(1)) == b"written by the other process"
    assert reader.sizes().reopens == 1
    now[0] += 1.0
    assert reader.get(key(1)) == b"written by the other process"
    assert reader.sizes().reopens == 1  # checked once, not reopened again


def test_a_write_whose_database_is_replaced_meanwhile_fails_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory deleted between the check and the commit: the write is a failure (the chain
    counts it and its breaker opens), not a success that nobody can read."""
    directory = tmp_path / "disk"
    tier = DiskTier(directory)
    tier.put(key(0), b"x" * LARGE)  # opened
    original = BytesOnlyDisk.filename

    def delete_then_name(self: Any, *args: Any, **kwargs: Any) -> Any:
        shutil.rmtree(directory)  # after the tier's check, before its value file is written
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BytesOnlyDisk, "filename", delete_then_name)
    chain = TierChain([tier], max_pending_write_bytes=0)
    assert not chain.save(key(1), np.zeros(LARGE // 4, np.float32))
    assert chain.stats().tier("disk").errors == 1
    monkeypatch.undo()
    assert value_files(directory) == []


def test_regression_failed_write_leaves_a_partial_value_file_outside_max_bytes(tmp_path: Path) -> None:
    """EFBIG, for real: a process whose file-size limit (RLIMIT_FSIZE) is 1 MiB writes 2 MiB values."""
    directory = tmp_path / "disk"
    script = textwrap.dedent(f"""
        import resource, signal
        from visioncache.tiers.disk import BytesOnlyDisk, DiskTier
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, resource.RLIM_INFINITY))
        tier = DiskTier({str(directory)!r}, 64 * 2**20)
        tier.put("small", b"s" * 2**19)  # a value file that fits
        failures = 0
        for index in range(16):
            try:
                tier.put(f"large-{{index}}", b"x" * {LARGE})
            except OSError:
                failures += 1
        print("failures", failures, "small", len(tier.get("small") or b""))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["failures", "16", "small", str(2**19)]
    sizes = [path.stat().st_size for path in value_files(directory)]
    assert sizes == [2**19], f"{len(sizes) - 1} partial files, {sum(sizes) - 2**19} bytes outside the budget"


def test_regression_database_error_after_the_value_file_was_written_leaves_it_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite failing after the value file is complete (e.g. "database or disk is full" while
    inserting its row): diskcache rolls the row back but keeps the file."""
    directory = tmp_path / "disk"
    tier = DiskTier(directory, 64 * 2**20)
    tier.put("opened", b"o")

    def full(*args: Any, **kwargs: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(diskcache.Cache, "_row_insert", full)
    for index in range(4):
        with pytest.raises(sqlite3.OperationalError):
            tier.put(f"large-{index}", b"x" * LARGE)
    monkeypatch.undo()
    assert value_files(directory) == []
    assert tier.get("opened") == b"o"


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (ENOSPC for real), where this process may mount one; unmounted afterwards."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no mount command")
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:  # lazily if a failed test left a file open there: never leave the mount behind
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_regression_failed_write_on_a_full_filesystem_leaves_partial_value_files(
    small_filesystem: Path,
) -> None:
    directory = small_filesystem / "disk"
    tier = DiskTier(directory, 64 * 2**20)
    try:
        tier.put("small", b"s" * 2**19)
        failures = 0
        for index in range(8):
            try:
                tier.put(f"large-{index}", b"x" * LARGE)
            except (OSError, sqlite3.Error):  # the value file, or SQLite's own pages, found no room
                failures += 1
        assert failures >= 6  # 4 MiB hold one 2 MiB value beside the rest, not eight
        kept = [tier.get(f"large-{index}") for index in range(8)]
        stored = sum(blob == b"x" * LARGE for blob in kept)
        assert stored == 8 - failures and tier.get("small") == b"s" * 2**19
        sizes = sorted(path.stat().st_size for path in value_files(directory))
        assert sizes == sorted([2**19] + [LARGE] * stored), "partial files left on a full filesystem"
    finally:
        tier.close()
