"""The background writer: jobs in order, bounded in bytes, failures contained, fork-safe, no stray thread."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable

import pytest

from visioncache.tiers.writer import BackgroundWriter


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def job(action: Callable[[], object]) -> Callable[[], Callable[[], object]]:
    """A `prepare` that hands the writer ``action`` as its job."""
    return lambda: action


def test_jobs_run_in_order_and_flush_waits_for_them() -> None:
    writer, done = BackgroundWriter(max_pending_bytes=10_000), []
    for index in range(50):
        assert writer.submit(10, job(lambda index=index: done.append(index)))
    assert writer.flush(timeout=10) and done == list(range(50))
    assert writer.pending == 0 and writer.pending_bytes == 0


def test_a_failing_job_does_not_stop_the_writer() -> None:
    writer, done = BackgroundWriter(1000), []
    writer.submit(1, job(lambda: 1 / 0))
    writer.submit(1, job(lambda: done.append("after")))
    assert writer.flush(timeout=10) and done == ["after"]


def test_flush_times_out_while_a_job_is_stuck() -> None:
    writer, release = BackgroundWriter(1000), threading.Event()
    writer.submit(1, job(lambda: release.wait(10)))
    assert writer.flush(timeout=0.05) is False
    release.set()
    assert writer.flush(timeout=10)


def test_abandon_takes_back_the_writes_not_started_and_counts_them() -> None:
    writer, release, done = BackgroundWriter(1000), threading.Event(), []
    writer.submit(10, job(lambda: (release.wait(10), done.append("running"))))
    for index in range(3):
        writer.submit(10, job(lambda index=index: done.append(index)))
    assert writer.flush(timeout=0.05) is False
    assert writer.abandon() == 3
    release.set()
    assert writer.flush(timeout=10)
    assert done == ["running"]  # the abandoned three never ran
    assert writer.dropped == 3 and writer.pending == 0 and writer.pending_bytes == 0


def test_queued_bytes_never_exceed_the_bound_and_drops_are_counted() -> None:
    writer, release, seen = BackgroundWriter(max_pending_bytes=100), threading.Event(), []
    prepared = []

    def prepare() -> Callable[[], object]:
        prepared.append(1)
        seen.append(writer.pending_bytes)
        return lambda: release.wait(10)

    results = [writer.submit(30, prepare) for _ in range(6)]
    assert results == [True, True, True, False, False, False]  # 90 bytes queued; 120 would pass 100
    assert writer.dropped == 3 and len(prepared) == 3  # a dropped write is never prepared (no copy)
    assert max(seen) <= 100 and writer.pending_bytes == 90
    release.set()
    assert writer.flush(timeout=10) and writer.pending_bytes == 0
    assert writer.submit(100, job(lambda: None))  # room again once written


def test_a_value_larger_than_the_whole_bound_is_dropped() -> None:
    writer = BackgroundWriter(max_pending_bytes=10)
    assert writer.submit(11, job(lambda: None)) is False and writer.dropped == 1


def test_a_failing_prepare_gives_its_bytes_back() -> None:
    writer = BackgroundWriter(max_pending_bytes=10)

    def broken() -> Callable[[], object]:
        raise RuntimeError("cannot copy")

    with pytest.raises(RuntimeError):
        writer.submit(10, broken)
    assert writer.pending_bytes == 0 and writer.submit(10, job(lambda: None))


def test_nothing_starts_before_the_first_write() -> None:
    before = threading.active_count()
    writer = BackgroundWriter(1000)
    assert writer._thread is None and threading.active_count() == before
    writer.submit(1, job(lambda: None))
    assert writer._thread is not None and writer.close(timeout=10)


def test_close_ends_the_thread() -> None:
    writer = BackgroundWriter(1000)
    writer.submit(1, job(lambda: None))
    thread = writer._thread
    assert thread is not None and writer.close(timeout=10)
    assert not thread.is_alive()


def test_an_unused_writer_is_collected_and_its_thread_ends() -> None:
    writer = BackgroundWriter(1000)
    writer.submit(1, job(lambda: None))
    thread = writer._thread
    assert thread is not None and writer.flush(timeout=10)
    del writer
    gc.collect()
    assert wait_until(lambda: not thread.is_alive())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_regression_writer_restarts_in_a_forked_child(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Defect: a forked child inherited a "started" writer with no thread, so nothing it
    queued was ever written and its exit waited 10 s."""
    writer = BackgroundWriter(1000)
    writer.submit(1, job(lambda: None))  # the parent's thread is running
    assert writer.flush(timeout=10)
    marker = tmp_path / "child-wrote"
    pid = os.fork()
    if pid == 0:  # the child: its write must run on a thread of its own
        try:
            writer.submit(1, job(lambda: marker.write_text("yes")))
            os._exit(0 if writer.flush(timeout=10) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0 and marker.read_text() == "yes"
