"""Write-behind for shared tiers: values are serialised and written by a background thread.

Why: a write to a lower tier (serialising a 3-20 MB value, then disk or network) must not add to
a request's latency, and a slow tier (answering just under its timeout) must not slow every
request that stores something. The queue is bounded; when it is full a write is dropped and
counted. The entry is still in memory, and the next miss will write it again. `flush` waits
for queued writes. Writes still queued at interpreter exit are flushed for up to
``EXIT_FLUSH_SECONDS``.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable

__all__ = ["EXIT_FLUSH_SECONDS", "BackgroundWriter"]

logger = logging.getLogger(__name__)
EXIT_FLUSH_SECONDS = 10.0

_Job = Callable[[], object]
_IDLE_CHECK_SECONDS = 1.0


class BackgroundWriter:
    """One daemon thread running submitted write jobs, in order."""

    def __init__(self, max_pending: int = 64):
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max_pending)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0
        # A weak reference, so the exit hook does not keep a discarded writer alive.
        reference = weakref.ref(self)
        atexit.register(lambda: (writer := reference()) is not None and writer.flush(EXIT_FLUSH_SECONDS))

    def submit(self, job: _Job) -> bool:
        """Queue a write job; False (and counted in ``dropped``) when the queue is full."""
        self._start()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            with self._lock:
                self.dropped += 1
            return False
        return True

    def _start(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                # The thread holds the queue, not the writer: a writer nobody uses any more is
                # collected, and its thread ends once the queue is empty.
                self._thread = threading.Thread(
                    target=_drain,
                    args=(self._queue, weakref.ref(self)),
                    name="visioncache-tier-writer",
                    daemon=True,
                )
                self._thread.start()

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then end the thread; False if ``timeout`` passed with writes still queued."""
        flushed = self.flush(timeout)
        if self._thread is not None and flushed:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None
        return flushed

    @property
    def pending(self) -> int:
        return self._queue.unfinished_tasks

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done; False if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._queue.all_tasks_done.wait(remaining)
        return True


def _drain(jobs: queue.Queue[_Job | None], owner: weakref.ref[BackgroundWriter]) -> None:
    """The writer thread: run jobs in order until closed (None) or until the owner is gone."""
    while True:
        try:
            job = jobs.get(timeout=_IDLE_CHECK_SECONDS)
        except queue.Empty:
            if owner() is None:
                return
            continue
        try:
            if job is None:
                return
            job()
        except Exception:  # the chain counts tier errors; anything else must not kill the thread
            logger.exception("background tier write failed")
        finally:
            jobs.task_done()
