"""The background writer: jobs in order, flush, failures contained, no thread outlives its use."""

from __future__ import annotations

import gc
import threading
import time

from visioncache.tiers.writer import BackgroundWriter


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_jobs_run_in_order_and_flush_waits_for_them():
    writer, done = BackgroundWriter(max_pending=100), []
    for index in range(50):
        assert writer.submit(lambda index=index: done.append(index))
    assert writer.flush(timeout=10) and done == list(range(50)) and writer.pending == 0


def test_a_failing_job_does_not_stop_the_writer():
    writer, done = BackgroundWriter(), []
    writer.submit(lambda: 1 / 0)
    writer.submit(lambda: done.append("after"))
    assert writer.flush(timeout=10) and done == ["after"]


def test_flush_times_out_while_a_job_is_stuck():
    writer, release = BackgroundWriter(), threading.Event()
    writer.submit(lambda: release.wait(10))
    assert writer.flush(timeout=0.05) is False
    release.set()
    assert writer.flush(timeout=10)


def test_close_ends_the_thread():
    writer = BackgroundWriter()
    writer.submit(lambda: None)
    thread = writer._thread
    assert thread is not None and writer.close(timeout=10)
    assert not thread.is_alive()


def test_an_unused_writer_is_collected_and_its_thread_ends():
    writer = BackgroundWriter()
    writer.submit(lambda: None)
    thread = writer._thread
    assert thread is not None and writer.flush(timeout=10)
    del writer
    gc.collect()
    assert wait_until(lambda: not thread.is_alive())
