"""Fork safety: objects that hold locks or threads get a hook around ``os.fork``.

Pre-fork servers (gunicorn, ``multiprocessing`` with ``fork``) copy a process while other threads
may be inside a lock or own work in flight. In the child those threads do not exist: a lock they
held stays held forever, and work they owned is never finished. A tracked object says how to
prepare: ``before_fork`` (e.g. take its lock, so no thread is inside it at the fork),
``after_fork_in_parent`` (give it back) and ``after_fork_in_child`` (give it back and drop what
belonged to the parent's threads). Objects are tracked weakly.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["ForkAware", "track"]


class ForkAware(Protocol):
    def before_fork(self) -> None: ...

    def after_fork_in_parent(self) -> None: ...

    def after_fork_in_child(self) -> None: ...


_TRACKED: weakref.WeakSet[ForkAware] = weakref.WeakSet()
_PREPARED: list[ForkAware] = []  # the objects prepared for the fork in progress, in order


def track(item: ForkAware) -> None:
    """Call ``item``'s hooks around every fork of this process while ``item`` lives."""
    _TRACKED.add(item)


def _before() -> None:
    _PREPARED[:] = list(_TRACKED)
    for item in _PREPARED:
        item.before_fork()


def _after_in_parent() -> None:
    for item in reversed(_PREPARED):
        item.after_fork_in_parent()
    _PREPARED.clear()


def _after_in_child() -> None:
    for item in reversed(_PREPARED):
        item.after_fork_in_child()
    _PREPARED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
