"""Forking at a chosen moment, and a child that is timed out by PID instead of hanging the test."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["CHILD_SECONDS", "held_by_another_thread", "run_in_child", "start_child", "wait_for_child"]

CHILD_SECONDS = 10.0
HOLD_SECONDS = 0.2  # how long the other thread stays inside after the fork began


def start_child(request: Callable[[], bool]) -> int:
    """Fork; the child runs ``request`` on its main thread and exits 0 if it returned True, 1
    otherwise. Returns the child's PID (to the parent)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test runner
        code = 1
        try:
            code = 0 if request() else 1
        finally:
            os._exit(code)
    return pid


def wait_for_child(pid: int, seconds: float = CHILD_SECONDS) -> str:
    """ "ok", "failed", or "hung" (still running after ``seconds``: then it is killed, by PID)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "ok" if os.waitstatus_to_exitcode(status) == 0 else "failed"
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def run_in_child(request: Callable[[], bool], seconds: float = CHILD_SECONDS) -> str:
    """`start_child` then `wait_for_child`."""
    return wait_for_child(start_child(request), seconds)


@contextmanager
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """Inside the block, another thread holds ``lock`` and keeps it until ``HOLD_SECONDS`` after
    the block began (so a fork at the start of the block happens while it is held)."""
    holding, forking = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            forking.wait(CHILD_SECONDS)
            time.sleep(HOLD_SECONDS)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert holding.wait(CHILD_SECONDS)
    forking.set()
    try:
        yield
    finally:
        thread.join(CHILD_SECONDS)
