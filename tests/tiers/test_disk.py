"""DiskTier: shared across processes, survives restarts, evicts within budget, never unpickles."""

from __future__ import annotations

import pickle
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import diskcache
import numpy as np
import pytest

from tests.support.tier_reads import contains, load
from visioncache.errors import CorruptEntryError
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DISK_SLACK_BYTES, DiskTier

TAG = "0123456789abcdef"


def key(index: int) -> str:
    return f"{TAG}/embedding/{index:064x}"


def embedding(index: int) -> np.ndarray:
    return np.random.default_rng(index).standard_normal((256, 64)).astype(np.float16)


@pytest.mark.slow
def test_second_process_hits_what_the_first_stored(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    writer = textwrap.dedent(f"""
        import numpy as np
        from visioncache.tiers.chain import TierChain
        from visioncache.tiers.disk import DISK_SLACK_BYTES, DiskTier
        chain = TierChain([DiskTier({str(directory)!r}, 64 * 2**20)])
        for index in range(8):
            value = np.random.default_rng(index).standard_normal((256, 64)).astype(np.float16)
            assert chain.save("{TAG}/embedding/" + format(index, "064x"), value)
    """)
    reader = textwrap.dedent(f"""
        import numpy as np
        from visioncache.tiers.chain import TierChain
        from visioncache.tiers.disk import DISK_SLACK_BYTES, DiskTier
        chain = TierChain([DiskTier({str(directory)!r}, 64 * 2**20)])
        hits = 0
        for index in range(8):
            (value,) = chain.load_many(["{TAG}/embedding/" + format(index, "064x")])
            expected = np.random.default_rng(index).standard_normal((256, 64)).astype(np.float16)
            hits += value is not None and value.dtype == expected.dtype and np.array_equal(value, expected)
        print("hits", hits)
    """)
    for script in (writer, reader):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hits", "8"]


def value_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.val"))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_file_entry_is_counted_deleted_and_missed(tmp_path: Path, damage: str) -> None:
    tier = DiskTier(tmp_path / "disk", 64 * 2**20)
    chain = TierChain([tier])
    large = np.arange(100_000, dtype=np.float32)  # 400 kB: stored in its own file
    assert chain.save(key(1), large)
    (path,) = value_files(tmp_path / "disk")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        del data[len(data) - 1000 :]
    path.write_bytes(bytes(data))
    assert load(chain, key(1)) is None
    assert chain.flush(timeout=30)  # corrupt entries are deleted in the background
    assert chain.stats().tier("disk").corrupt == 1
    assert not contains(tier, key(1))
    assert chain.save(key(1), large)  # and the key works again afterwards
    assert np.array_equal(load(chain, key(1)), large)


def test_corrupt_inline_entry_in_sqlite(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "disk", 64 * 2**20)
    chain = TierChain([tier])
    chain.save(key(2), [1, 2, 3])  # small: stored inside the SQLite database
    with sqlite3.connect(tmp_path / "disk" / "cache.db") as database:
        (blob,) = database.execute("SELECT value FROM Cache WHERE key = ?", (key(2),)).fetchone()
        damaged = bytes(blob).replace(b"[1,2,3]", b"[1,2,4]")
        database.execute("UPDATE Cache SET value = ? WHERE key = ?", (damaged, key(2)))
    assert load(chain, key(2)) is None
    assert chain.flush(timeout=30)  # corrupt entries are deleted in the background
    assert chain.stats().tier("disk").corrupt == 1
    assert not contains(tier, key(2))


UNPICKLED: list[str] = []


def mark_unpickled(note: str) -> None:
    UNPICKLED.append(note)


class Trap:
    """Unpickling it calls `mark_unpickled`: proof of whether anything unpickled it."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (mark_unpickled, ("unpickled!",))


def test_pickled_values_are_never_unpickled(tmp_path: Path) -> None:
    foreign = diskcache.Cache(str(tmp_path / "disk"))  # the default Disk pickles objects
    foreign.set(key(3), Trap())
    foreign.close()
    pickle.loads(pickle.dumps(Trap()))
    assert UNPICKLED == ["unpickled!"]  # armed
    UNPICKLED.clear()
    tier = DiskTier(tmp_path / "disk")
    with pytest.raises(CorruptEntryError):
        tier.get(key(3))
    chain = TierChain([tier])
    assert load(chain, key(3)) is None
    assert UNPICKLED == []
    assert chain.flush(timeout=30)  # corrupt entries are deleted in the background
    assert chain.stats().tier("disk").corrupt == 1 and not contains(tier, key(3))
    with pytest.raises(TypeError):
        tier.put(key(4), "a str, not bytes")  # type: ignore[arg-type]


def test_filling_the_budget_evicts_least_recently_used(tmp_path: Path) -> None:
    budget = 4 * 2**20
    tier = DiskTier(tmp_path / "disk", budget)
    chain = TierChain([tier])
    values = {index: np.full(64 * 1024, index, dtype=np.float32) for index in range(40)}  # 256 kB
    for index, value in values.items():
        assert chain.save(key(index), value)
        if index >= 1:
            assert load(chain, key(0)) is not None  # keep key 0 recently used
    stats = chain.stats().tier("disk")
    assert stats.errors == 0
    assert stats.entries < 40
    assert stats.bytes is not None and stats.bytes <= budget  # culled down to the bound after each write
    assert np.array_equal(load(chain, key(0)), values[0])
    assert np.array_equal(load(chain, key(39)), values[39])
    assert load(chain, key(1)) is None  # least recently used went first


def directory_bytes(directory: Path) -> int:
    """Everything in the directory: the database, its write-ahead log and shared memory, values."""
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def test_regression_a_small_disk_tier_empties_itself_and_overshoots_its_bound(tmp_path: Path) -> None:
    """With ``max_bytes`` 256 KiB and 50 KiB values, diskcache's cull (up to 10 rows once its
    estimate passes the bound, inside the write) deleted the entry just written every 5th write:
    20 of 100 writes counted as stored were gone, 0 entries remained, and the SQLite write-ahead
    log, outside the bound, grew to 2.3 MB after 100 writes and 4.4 MB (17x) after 200. Now
    every write culls least-recently-used entries one at a time, never itself, down to the
    bound, and the log is checkpointed and truncated: the directory stays within ``max_bytes``
    plus the slack docs/tiers.md states."""
    directory, bound = tmp_path / "disk", 256 * 1024
    tier = DiskTier(directory, bound)
    for index in range(200):
        tier.put(key(index), np.random.default_rng(index).bytes(50 * 1024))
        assert tier.get(key(index)) is not None, f"write {index} counted as stored is gone"
        if index >= 1:
            assert tier.get(key(0)) is not None  # the most recently used survives every cull
        sizes = tier.sizes()
        assert sizes.bytes is not None and sizes.bytes <= bound
        assert directory_bytes(directory) <= bound + DISK_SLACK_BYTES
    assert tier.sizes().entries == 4  # as many as fit: 0, the one just written, and two more
    assert tier.get(key(197)) is not None and tier.get(key(1)) is None  # least recently used went
    assert tier.sizes().rejections == 0


def test_a_value_that_fits_the_bound_only_without_the_database_is_not_stored(tmp_path: Path) -> None:
    """A blob under ``max_bytes`` that, with the database's own pages, is over it: storing it
    would evict everything and still overshoot, so it is dropped and counted, the rest kept."""
    tier = DiskTier(tmp_path / "disk", 256 * 1024)
    tier.put(key(1), b"a" * 50 * 1024)
    tier.put(key(2), b"b" * (256 * 1024 - 100))
    assert tier.get(key(2)) is None and tier.sizes().rejections == 1
    assert tier.sizes().bytes is not None and tier.sizes().bytes <= 256 * 1024


def test_blob_larger_than_budget_is_rejected(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "disk", 2**20)
    tier.put(key(5), b"x" * (2**20 + 1))
    assert not contains(tier, key(5))
    assert tier.sizes().rejections == 1


def test_reopening_without_a_limit_keeps_the_stored_one(tmp_path: Path) -> None:
    first = DiskTier(tmp_path / "disk", 3 * 2**20)
    first.put("key", b"blob")  # the directory is created at the first operation
    first.close()
    assert DiskTier(tmp_path / "disk").sizes().max_bytes == 3 * 2**20
