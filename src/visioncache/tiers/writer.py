"""Write-behind for shared tiers: one daemon thread runs queued writes, bounded in bytes.

Why: a write to a lower tier (serialising a 3-20 MB value, then disk or network) must not add to a
request's latency, and a slow tier must not slow every request that stores something.

Guarantees:
- the bytes of queued writes never exceed ``max_pending_bytes``: a write that would pass it is
  dropped and counted (``dropped``) without blocking the caller. Its value is still in memory,
  and the next miss writes it again;
- the caller reserves room first and only then prepares the job (a host snapshot of the value,
  flattened for serialisation), so a dropped write costs no copy, and the job only packs bytes;
- nothing starts until the first `submit` (no thread for a cache that never writes);
- fork-safe: a child process (pre-fork servers, ``multiprocessing``) gets a fresh, empty queue
  and starts its own thread at its first write; the parent's queued writes stay the parent's;
- `flush` waits for queued writes; `close` flushes and ends the thread; `abandon` takes back
  the writes not started yet (a shutdown with a deadline: each is counted in ``dropped``, none
  is lost uncounted). Writes still queued at interpreter exit are flushed for up to
  ``EXIT_FLUSH_SECONDS`` (call ``close()`` to be sure).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable

from visioncache import forking

__all__ = ["EXIT_FLUSH_SECONDS", "BackgroundWriter"]

logger = logging.getLogger(__name__)
EXIT_FLUSH_SECONDS = 10.0

Job = Callable[[], object]
_IDLE_CHECK_SECONDS = 1.0
_LIVE_WRITERS: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()
_LIVE_WRITERS_LOCK = forking.lock()  # other threads may still make writers while exit flushes


class _Queue:
    """What the thread shares with its writer: the jobs and the bytes they hold."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[tuple[Job, int] | None] = queue.Queue()
        self.lock = threading.Lock()
        self.pending_bytes = 0


class BackgroundWriter:
    """Runs submitted write jobs in order on one daemon thread (see the module docstring)."""

    def __init__(self, max_pending_bytes: int):
        self.max_pending_bytes = max_pending_bytes
        self.dropped = 0
        self._reset()
        with _LIVE_WRITERS_LOCK:
            _LIVE_WRITERS.add(self)
        forking.track(self)

    def _reset(self) -> None:
        self._state = _Queue()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    # ---- fork safety (`visioncache.forking`) -----------------------------------------------------
    def before_fork(self) -> None:
        self._state.lock.acquire()

    def after_fork_in_parent(self) -> None:
        self._state.lock.release()

    def after_fork_in_child(self) -> None:
        # The parent's thread does not exist here; its queued writes stay the parent's.
        self._state.lock.release()
        self._reset()

    def submit(self, nbytes: int, prepare: Callable[[], Job]) -> bool:
        """Reserve ``nbytes``, then queue ``prepare()``'s job; False (counted) if it does not fit."""
        state = self._state
        with state.lock:
            if state.pending_bytes + nbytes > self.max_pending_bytes:
                self.dropped += 1
                return False
            state.pending_bytes += nbytes
            self._start_locked(state)
        try:
            job = prepare()
        except BaseException:
            with state.lock:
                state.pending_bytes -= nbytes
            raise
        state.jobs.put((job, nbytes))
        return True

    def _start_locked(self, state: _Queue) -> None:
        if self._thread is None:
            # The thread holds the queue, not the writer: a writer nobody uses any more is
            # collected, and its thread ends once the queue is empty.
            self._thread = threading.Thread(
                target=_drain, args=(state, weakref.ref(self)), name="visioncache-tier-writer", daemon=True
            )
            self._thread.start()

    @property
    def pending(self) -> int:
        """Writes queued or running."""
        return self._state.jobs.unfinished_tasks

    @property
    def pending_bytes(self) -> int:
        return self._state.pending_bytes

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done; False if ``timeout`` seconds passed first."""
        jobs = self._state.jobs
        deadline = None if timeout is None else time.monotonic() + timeout
        with jobs.all_tasks_done:
            while jobs.unfinished_tasks:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                jobs.all_tasks_done.wait(remaining)
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then end the thread; False if ``timeout`` passed with writes still queued."""
        flushed = self.flush(timeout)
        thread = self._thread
        if thread is not None and flushed:
            self._state.jobs.put(None)
            thread.join(timeout)
            self._thread = None
        return flushed

    def abandon(self) -> int:
        """Take back every queued write not started yet: never run, counted in ``dropped``;
        returns how many. A write already running finishes."""
        state, abandoned, closing = self._state, 0, False
        while True:
            try:
                item = state.jobs.get_nowait()
            except queue.Empty:
                break
            if item is None:
                closing = True
            else:
                with state.lock:
                    state.pending_bytes -= item[1]
                    self.dropped += 1
                abandoned += 1
            state.jobs.task_done()
        if closing:
            state.jobs.put(None)
        return abandoned


def _drain(state: _Queue, owner: weakref.ref[BackgroundWriter]) -> None:
    """The writer thread: run jobs in order until closed (None) or until the owner is gone."""
    while True:
        try:
            item = state.jobs.get(timeout=_IDLE_CHECK_SECONDS)
        except queue.Empty:
            if owner() is None:
                return
            continue
        try:
            if item is None:
                return
            job, nbytes = item
            try:
                job()
            finally:
                with state.lock:
                    state.pending_bytes -= nbytes
        except Exception:  # the chain counts tier errors; anything else must not kill the thread
            logger.exception("background tier write failed")
        finally:
            state.jobs.task_done()


def _flush_at_exit() -> None:
    with _LIVE_WRITERS_LOCK:
        writers = list(_LIVE_WRITERS)
    for writer in writers:
        if writer._pid == os.getpid() and not writer.flush(EXIT_FLUSH_SECONDS):
            logger.warning("exiting with %d tier writes still queued", writer.pending)


atexit.register(_flush_at_exit)
