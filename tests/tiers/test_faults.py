"""The shared tiers' promises under faults, one contract run against a real disk
directory, a real Redis server and a real 3-node Redis Cluster:

- a locked (disk: another connection holds SQLite's write lock) or stalled (SIGSTOP: the Redis
  server; one node of the cluster's three) tier costs a request at most one call per retry
  interval, then none while its breaker is open; its stats (every metrics scrape) likewise;
- mutating a returned value after the call never reaches another process;
- queued write bytes never exceed ``max_pending_write_bytes``;
- a writer process killed with SIGKILL leaves no entry that reads back wrong (partial writes miss).

Costs are counted (calls that reach the tier, breaker skips), never timed.
"""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("redis", "redis")

import itertools
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch

from tests.conftest import encode_image, random_image
from tests.tiers.conftest import FakeClock
from tests.tiers.fault_writer import PATIENT, entry_key, stored_value, tier_from_spec
from visioncache import VisionEmbeddingCache, compute_image_hash
from visioncache.tiers.base import Tier
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.stats import TierSizes

REPOSITORY = Path(__file__).parents[2]
INTERVAL = 5.0
_seeds = itertools.count(10_000)


def new_images(count: int) -> list[bytes]:
    """Images no test has used before (so every lookup of them is a miss everywhere)."""
    return [encode_image(random_image(next(_seeds))) for _ in range(count)]


def value_of(image: bytes) -> np.ndarray:
    """The value a correct encoder gives ``image``: its digest's bytes (so it names the image)."""
    return np.frombuffer(bytes.fromhex(compute_image_hash(image)), np.uint8).astype(np.float32).reshape(4, 8)


class Encoder:
    def __init__(self, framework: str = "numpy") -> None:
        self.framework = framework
        self.encoded = 0

    def __call__(self, images: list[bytes]) -> list[Any]:
        self.encoded += len(images)
        values = [value_of(image) for image in images]
        return [torch.from_numpy(value) for value in values] if self.framework == "torch" else values


def as_numpy(value: Any) -> np.ndarray:
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def all_correct(values: list[Any], images: list[bytes]) -> bool:
    return len(values) == len(images) and all(
        value is not None and np.array_equal(as_numpy(value), value_of(image))
        for value, image in zip(values, images, strict=True)
    )


@dataclass
class Backend:
    """One storage under test: new tier objects on it, and a way to make it stop answering."""

    spec: dict[str, Any]
    stall: Callable[[], AbstractContextManager[None]]
    recover: Callable[[], None] = lambda: None
    stalls: Callable[[str], bool] = lambda tier_key: True  # whether a stall stops this key's server

    def make(self) -> Tier:
        return tier_from_spec(self.spec)

    def images_reaching_the_stall(self, cache: VisionEmbeddingCache, count: int) -> list[bytes]:
        """``count`` new images, one of which (at least) is stored where the stall stops: a
        cluster's stopped node holds a third of the slots, and keys change with their format."""
        chain = cache.tiers
        assert isinstance(chain, TierChain)
        while True:
            batch = new_images(count)
            if any(self.stalls(chain.tier_keys(str(cache.key("embedding", [item])))[0]) for item in batch):
                return batch


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Another process's connection holding SQLite's write lock on the directory's database."""
    tier = DiskTier(directory)
    tier.put("__lock-probe__", b"x")  # the database exists before it is locked
    tier.close()
    connection = sqlite3.connect(directory / "cache.db", timeout=0, isolation_level=None)
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        connection.execute("ROLLBACK")
        connection.close()


@contextmanager
def stopped(*pids: int) -> Iterator[None]:
    """Processes alive but answering nothing (SIGSTOP), resumed afterwards."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def faults_server(redis_process_factory: Callable[[], Any]) -> Any:
    """A Redis server of this module's own: these tests stop it."""
    return redis_process_factory()


@pytest.fixture(scope="module")
def faults_cluster(redis_cluster_factory: Callable[[], Any]) -> Iterator[Any]:
    """A Redis Cluster of this module's own: these tests stop one of its nodes."""
    cluster = redis_cluster_factory()
    yield cluster
    cluster.stop()


def wait_for_cluster(url: str, timeout: float = 30.0) -> None:
    """Wait until the cluster serves writes again (after a node was stopped past its node timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client = redis.RedisCluster.from_url(url, socket_timeout=1.0)
            try:
                client.set("faults:probe", b"1")
                return
            finally:
                client.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture(params=["disk", "redis", pytest.param("cluster", marks=pytest.mark.slow)])
def backend(request: pytest.FixtureRequest, tmp_path: Path, redis_prefix: str) -> Backend:
    if request.param == "disk":
        directory = tmp_path / "disk"
        return Backend({"kind": "disk", "directory": str(directory)}, lambda: locked(directory))
    if request.param == "redis":
        server = request.getfixturevalue("faults_server")
        spec = {"kind": "redis", "url": server.url, "prefix": redis_prefix}
        return Backend(spec, lambda: stopped(server.process.pid))
    cluster = request.getfixturevalue("faults_cluster")
    spec = {"kind": "cluster", "url": cluster.url, "prefix": redis_prefix}
    # One node of three: keys on the other two are served until a call touches the stopped one.
    client = redis.RedisCluster.from_url(cluster.url)
    stopped_port = cluster.ports[1]

    def on_the_stopped_node(tier_key: str) -> bool:
        return bool(client.get_node_from_key(redis_prefix + tier_key).port == stopped_port)

    return Backend(
        spec,
        lambda: stopped(cluster.processes[1].pid),
        lambda: wait_for_cluster(cluster.url),
        on_the_stopped_node,
    )


@dataclass
class Call:
    thread: int
    method: str
    failed: bool


@dataclass
class CountingTier:
    """A tier that records every call reaching the real tier below it (and whether it failed)."""

    tier: Tier
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = self.tier.name
        self.network = self.tier.network
        self._lock = threading.Lock()

    def _call(self, method: str, *args: Any) -> Any:
        failed = True
        try:
            result = getattr(self.tier, method)(*args)
            failed = False
            return result
        finally:
            with self._lock:
                self.calls.append(Call(threading.get_ident(), method, failed))

    def get(self, key: str) -> bytes | None:
        return self._call("get", key)  # type: ignore[no-any-return]

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        return self._call("get_many", keys)  # type: ignore[no-any-return]

    def put(self, key: str, blob: bytes) -> None:
        self._call("put", key, blob)

    def delete(self, key: str) -> None:
        self._call("delete", key)

    def contains_many(self, keys: list[str]) -> list[bool]:
        return self._call("contains_many", keys)  # type: ignore[no-any-return]

    def sizes(self) -> TierSizes:
        return self._call("sizes")  # type: ignore[no-any-return]

    def close(self) -> None:
        self.tier.close()


# ---- a locked or stalled tier costs at most one call per interval --------------------------------
def test_stalled_tier_costs_each_request_at_most_one_call_per_interval(backend: Backend) -> None:
    clock = FakeClock()
    tier = CountingTier(backend.make())
    chain = TierChain([tier], retry_interval=INTERVAL, clock=clock, max_pending_write_bytes=0)
    cache = VisionEmbeddingCache(tiers=chain)
    warm = new_images(1)
    assert all_correct(cache.encode_images(warm, Encoder()), warm)
    assert tier.calls and not any(call.failed for call in tier.calls)  # healthy: reads and writes

    with backend.stall():
        for _interval in range(2):
            requests: list[list[Call]] = []
            for _ in range(10):
                before, batch = len(tier.calls), new_images(2)
                assert all_correct(cache.encode_images(batch, Encoder()), batch)  # never fails
                requests.append(tier.calls[before:])
            failures = [sum(call.failed for call in calls) for calls in requests]
            assert sum(failures) == 1, failures  # one call per interval reached the stalled tier
            first = failures.index(1)
            assert requests[first][-1].failed  # and it was the request's last call: nothing after it
            assert all(calls == [] for calls in requests[first + 1 :])  # breaker open: no call at all
            clock.now += INTERVAL  # next interval: one probe
    backend.recover()

    batch = new_images(3)
    assert all_correct(cache.encode_images(batch, Encoder()), batch)  # the probe succeeds ...
    stats = chain.stats().tier(tier.name)
    assert (stats.errors, stats.breaker_open) == (2, False) and stats.skipped > 0
    reader = VisionEmbeddingCache(tiers=[backend.make()])
    assert all_correct(reader.encode_images(batch, Encoder()), batch)  # ... and writes go through
    assert reader.get_stats()["embedding_cache_computed"] == 0


def test_stalled_tier_under_concurrent_requests_costs_each_at_most_one_call(backend: Backend) -> None:
    clock = FakeClock()
    tier = CountingTier(backend.make())
    cache = VisionEmbeddingCache(
        tiers=TierChain([tier], retry_interval=INTERVAL, clock=clock, max_pending_write_bytes=0)
    )
    cache.encode_images(new_images(1), Encoder())
    threads, per_thread = 4, 5
    batches = [[new_images(2) for _ in range(per_thread)] for _ in range(threads)]
    failures: list[int] = []
    wrong: list[int] = []
    barrier = threading.Barrier(threads)

    def requests(mine: list[list[bytes]]) -> None:
        barrier.wait()
        for batch in mine:
            before = [call for call in tier.calls if call.thread == threading.get_ident()]
            if not all_correct(cache.encode_images(batch, Encoder()), batch):
                wrong.append(1)
            after = [call for call in tier.calls if call.thread == threading.get_ident()]
            failures.append(sum(call.failed for call in after[len(before) :]))

    with backend.stall():
        workers = [threading.Thread(target=requests, args=(mine,)) for mine in batches]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert not any(worker.is_alive() for worker in workers)
    backend.recover()
    assert wrong == [] and len(failures) == threads * per_thread
    assert max(failures) <= 1  # no request paid more than one call to the stalled tier
    # Only requests that passed the closed breaker before the first failure was recorded reach it.
    assert 1 <= sum(failures) <= threads
    assert cache.snapshot().tiers is not None
    assert cache.snapshot().tiers.tier(tier.name).errors == sum(failures)  # type: ignore[union-attr]


def test_regression_stats_of_a_locked_tier_wait_on_it_at_every_scrape(backend: Backend) -> None:
    """Stats run at every metrics scrape and must be cheap: a disk tier whose database was locked
    before this process opened it made every ``get_stats()`` wait a full timeout to open it, outside
    the breaker. Now a tier whose stats fail counts as failing, and an open breaker skips its stats."""
    clock = FakeClock()
    tier = CountingTier(backend.make())  # never opened before the stall
    chain = TierChain([tier], retry_interval=INTERVAL, clock=clock, max_pending_write_bytes=0)
    cache = VisionEmbeddingCache(tiers=chain)
    batch = backend.images_reaching_the_stall(cache, 2)
    with backend.stall():
        for _ in range(5):
            cache.get_stats()  # scrapes
        assert all_correct(cache.encode_images(batch, Encoder()), batch)
        for _ in range(5):
            cache.get_stats()
    backend.recover()
    failed = [call.method for call in tier.calls if call.failed]
    assert len(failed) == 1, failed  # one call of either kind per interval waits on the stalled tier
    assert chain.stats().tier(tier.name).breaker_open


# ---- snapshots, not references -------------------------------------------------------------------
class GatedTier(CountingTier):
    """A tier whose writes wait until the test opens the gate (a slow disk, a busy server)."""

    def __init__(self, tier: Tier) -> None:
        super().__init__(tier)
        self.gate = threading.Event()

    def put(self, key: str, blob: bytes) -> None:
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        super().put(key, blob)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_mutating_a_returned_value_never_reaches_another_process(backend: Backend, framework: str) -> None:
    tier = GatedTier(backend.make())
    cache = VisionEmbeddingCache(tiers=TierChain([tier]))  # background writes
    plug = new_images(1)
    cache.encode_images(plug, Encoder(framework))  # its write waits at the gate: the queue is held
    batch = new_images(3)
    out = cache.encode_images(batch, Encoder(framework))  # queued behind it, not yet serialised
    for value in out:
        value += 7  # the caller reuses the buffer
    assert not all_correct(out, batch)  # armed: the objects returned were changed in place
    tier.gate.set()
    assert cache.tiers is not None and cache.tiers.flush(timeout=60)
    reader = VisionEmbeddingCache(tiers=[backend.make()])
    got = reader.get_image_embeddings(batch + plug)
    assert all_correct(got, batch + plug)  # the values as returned, not as mutated afterwards
    expected = torch.Tensor if framework == "torch" else np.ndarray
    assert all(isinstance(value, expected) for value in got)


# ---- bounded write queue -------------------------------------------------------------------------
def test_queued_write_bytes_never_exceed_the_bound(backend: Backend) -> None:
    tier = GatedTier(backend.make())
    value_bytes = 4 * 8 * 4  # value_of: a (4, 8) float32 array
    bound = 5 * value_bytes
    chain = TierChain([tier], max_pending_write_bytes=bound)
    cache = VisionEmbeddingCache(tiers=chain)
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(chain.stats().writes_pending_bytes)
            time.sleep(0.0005)

    threads, per_thread = 4, 10
    batches = [[new_images(2) for _ in range(per_thread)] for _ in range(threads)]
    wrong: list[int] = []

    def requests(mine: list[list[bytes]]) -> None:
        for batch in mine:
            if not all_correct(cache.encode_images(batch, Encoder()), batch):
                wrong.append(1)
            samples.append(chain.stats().writes_pending_bytes)

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers = [threading.Thread(target=requests, args=(mine,)) for mine in batches]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    done.set()
    sampler.join(60)
    stats = chain.stats()
    writes = threads * per_thread * 2
    assert wrong == [] and len(samples) > threads * per_thread
    assert max(samples) <= bound  # never more queued than the bound, at any sample
    assert (stats.writes_pending_bytes, stats.writes_dropped) == (bound, writes - 5)  # full, never blocking
    tier.gate.set()
    assert chain.flush(timeout=60) and chain.stats().writes_pending_bytes == 0
    every = [image for mine in batches for batch in mine for image in batch]
    found = VisionEmbeddingCache(tiers=[backend.make()]).get_image_embeddings(every)
    stored = [(value, image) for value, image in zip(found, every, strict=True) if value is not None]
    assert len(stored) == 5 and all_correct([value for value, _ in stored], [image for _, image in stored])


# ---- a killed writer leaves nothing wrong --------------------------------------------------------
def test_sigkilled_writer_leaves_no_entry_that_reads_back_wrong(backend: Backend) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.tiers.fault_writer", json.dumps(backend.spec)],
        cwd=REPOSITORY,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        confirmed = 0
        assert writer.stdout is not None
        while confirmed < 24:
            line = writer.stdout.readline()
            assert line, "the writer process exited early"
            confirmed = int(line)
        time.sleep(random.uniform(0.0, 0.05))  # land anywhere in a write
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    reader = TierChain([tier_from_spec(backend.spec, PATIENT)], max_pending_write_bytes=0)
    keys = [entry_key(index) for index in range(confirmed + 64)]
    wrong, found = [], 0
    for index, entry in enumerate(reader.load_entries(keys)):
        if entry is None:
            assert index >= confirmed, f"entry {index} was flushed before the kill but is gone"
            continue
        found += 1
        value, cost = entry
        if not (np.array_equal(value, stored_value(index)) and cost == float(index)):
            wrong.append(index)
    assert wrong == [] and found >= confirmed
