"""Exact counters that threads add to without a shared lock: each thread has a tally of its own.

Why: a cache hit must cost about a hash. A shared lock taken on every hit convoys threads under
the GIL: with two threads, hits/s fell to a third of one thread's (benchmarks/bench_embeddings.py).
Here a thread only ever writes its own tally, so no update is lost, and a read sums the tallies.
Tallies of finished threads are folded into a base, so a server that starts many short-lived
threads does not accumulate them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

__all__ = ["ThreadCounters"]

_Tally = dict[str, float]


class ThreadCounters:
    """Named counters; `local()` is the calling thread's tally, to add to in place."""

    def __init__(self, names: Iterable[str]):
        self.names = tuple(names)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._tallies: list[tuple[weakref.ref[threading.Thread], _Tally]] = []
        self._base: _Tally = dict.fromkeys(self.names, 0)  # finished threads, minus resets

    # fork safety: the owner (`Store`) calls these from its own hooks, after taking its own lock,
    # because a thread holding the store's lock may be waiting for this one (never the reverse)
    def before_fork(self) -> None:
        self._lock.acquire()

    def after_fork_in_parent(self) -> None:
        self._lock.release()

    def after_fork_in_child(self) -> None:
        self._lock.release()

    def local(self) -> _Tally:
        """This thread's tally (created on first use); only this thread may write to it."""
        tally: _Tally | None = getattr(self._local, "tally", None)
        if tally is None:
            tally = dict.fromkeys(self.names, 0)
            with self._lock:
                self._fold_finished_threads()
                self._tallies.append((weakref.ref(threading.current_thread()), tally))
            self._local.tally = tally
        return tally

    def _fold_finished_threads(self) -> None:
        alive = []
        for thread_ref, tally in self._tallies:
            thread = thread_ref()
            if thread is not None and thread.is_alive():
                alive.append((thread_ref, tally))
            else:  # it will never write again: keep its counts in the base
                for name in self.names:
                    self._base[name] += tally[name]
        self._tallies = alive

    def snapshot(self) -> _Tally:
        """The totals: every thread's tally plus the base."""
        with self._lock:
            totals = dict(self._base)
            for _, tally in self._tallies:
                for name in self.names:
                    totals[name] += tally[name]
        return totals

    def reset(self) -> None:
        """Make every total zero (by moving the base, since tallies belong to their threads)."""
        totals = self.snapshot()
        with self._lock:
            for name in self.names:
                self._base[name] -= totals[name]
