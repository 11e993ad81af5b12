"""Fork safety: every lock a visioncache thread can hold is free in a forked child.

Pre-fork servers (gunicorn, ``multiprocessing`` with ``fork``) copy a process while other threads
may be inside a lock, inside SQLite, or own work in flight. In the child those threads do not
exist: a lock they held stays held forever, and work they owned is never finished. Three tools:

- `lock()`: a plain ``threading.Lock`` that every fork takes first and gives back after, so no
  thread is inside it when the process is copied (the fork waits for the holder to leave);
- `Gate`: operations (a disk tier's SQLite transactions) that a fork waits for, and that wait for
  a fork in progress, without serialising each other;
- `track(item)`: an object with its own hooks: ``before_fork`` (e.g. take its lock),
  ``after_fork_in_parent`` (give it back) and ``after_fork_in_child`` (give it back and drop what
  belonged to the parent's threads: claims in flight, a writer's queue, connections).

Locks taken this way must not be held while taking another (leaves), or while inside a `Gate`:
a fork takes them in no particular order. Objects and locks are tracked weakly.

Race-free by construction: registering (`track`, `lock`) and the fork's snapshot of what is
registered take one registry lock, which the fork holds until it is over. So no thread can grow a
set while the fork reads it (iterating a set another thread grows raises, and a raising hook lets
the fork go ahead unprotected), and nothing made during the fork escapes it: a thread creating a
cache then waits for the fork, outside every lock it could hand on held. Nothing registers from
inside a tracked lock, a `Gate` or a weakref callback, so the registry lock is always a leaf.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = ["ForkAware", "Gate", "lock", "track"]


class ForkAware(Protocol):
    def before_fork(self) -> None: ...

    def after_fork_in_parent(self) -> None: ...

    def after_fork_in_child(self) -> None: ...


_REGISTRY = threading.Lock()  # guards the two sets below; held by a fork from start to end
_TRACKED: weakref.WeakSet[ForkAware] = weakref.WeakSet()
_LOCKS: weakref.WeakSet[threading.Lock] = weakref.WeakSet()
_PREPARED: list[ForkAware] = []  # the objects prepared for the fork in progress, in order
_HELD: list[threading.Lock] = []  # the locks taken for the fork in progress
_FORKING: list[bool] = []  # [True] while a fork holds the registry (a list: no `global`)


def track(item: ForkAware) -> None:
    """Call ``item``'s hooks around every fork of this process while ``item`` lives."""
    with _REGISTRY:
        _TRACKED.add(item)


def lock() -> threading.Lock:
    """A new ``threading.Lock`` that no thread holds while this process forks (see the module
    docstring: hold it only briefly, and take no other lock while holding it)."""
    made = threading.Lock()
    with _REGISTRY:
        _LOCKS.add(made)
    return made


class Gate:
    """Operations that must not be in progress when the process forks (e.g. SQLite calls: a child
    copied while a thread is inside SQLite inherits its mutexes held).

    ``with gate.entered():`` around each operation; a fork waits until none is in progress, and new
    ones wait until the fork is done. Operations do not wait for each other, and a thread may enter
    again while inside.
    """

    def __init__(self) -> None:
        self._reset()
        track(self)

    def _reset(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._active = 0
        self._forking = False
        self._depth = threading.local()

    @contextmanager
    def entered(self) -> Iterator[None]:
        depth = getattr(self._depth, "value", 0)
        if depth:  # already inside: a fork is waiting for this thread, not the reverse
            self._depth.value = depth + 1
            try:
                yield
            finally:
                self._depth.value = depth
            return
        with self._condition:
            while self._forking:
                self._condition.wait()
            self._active += 1
        self._depth.value = 1
        try:
            yield
        finally:
            self._depth.value = 0
            with self._condition:
                self._active -= 1
                if not self._active:
                    self._condition.notify_all()

    def before_fork(self) -> None:
        self._condition.acquire()  # held across the fork; `wait` lets operations finish meanwhile
        self._forking = True
        while self._active:
            self._condition.wait()

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._condition.notify_all()
        self._condition.release()

    def after_fork_in_child(self) -> None:
        self._reset()  # the waiters were the parent's threads


def _before() -> None:
    """Take the registry, then prepare every tracked object and take every lock, in that order.
    ``_PREPARED`` and ``_HELD`` grow one item at a time, after it is taken, so `_after` undoes
    exactly what was done; a hook that raises (a bug) undoes it all before the fork goes ahead."""
    _REGISTRY.acquire()
    _FORKING.append(True)
    try:
        for item in list(_TRACKED):  # a WeakSet defers the collector's removals while iterated
            item.before_fork()
            _PREPARED.append(item)
        for held in list(_LOCKS):
            held.acquire()
            _HELD.append(held)
    except BaseException:
        _after(in_child=False)
        raise


def _after(in_child: bool) -> None:
    if not _FORKING:  # `_before` raised and undid itself already
        return
    for held in reversed(_HELD):
        held.release()
    _HELD.clear()
    for item in reversed(_PREPARED):
        (item.after_fork_in_child if in_child else item.after_fork_in_parent)()
    _PREPARED.clear()
    _FORKING.clear()
    _REGISTRY.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before,
        after_in_parent=lambda: _after(in_child=False),
        after_in_child=lambda: _after(in_child=True),
    )
